from ipvsctl.cli.app import main

main()
