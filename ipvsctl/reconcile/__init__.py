"""The stateful core: apply source events, plan per Service, program the kernel, drain."""
