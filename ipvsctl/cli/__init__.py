"""The command line: `ipvsctl` and its commands (app.py: plan, run, status; cleanup;
shutdown-manager; node-drain), their flags and what they print (output, render, status);
params.py checks flag values, config_file.py reads `run --config`'s kube-proxy file. The only
package that imports typer; long-running processes are started through ipvsctl.daemon."""
