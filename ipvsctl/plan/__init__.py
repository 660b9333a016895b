"""Pure planning: desired state from objects, and the kernel operations that reach it."""
