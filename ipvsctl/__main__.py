from ipvsctl.shell.cli import main

main()
