"""The command line: `ipvsctl` and its commands (app.py: plan, status, completion; run.py;
cleanup; shutdown-manager; node-drain), their flags (flags.py: typer's declarations) and
what they print (output, render, status); params.py checks flag values, errors.py fails with
one line. The only package that imports typer; `run`'s flags are completed into options by
ipvsctl.daemon.options, and long-running processes are started through ipvsctl.daemon."""
