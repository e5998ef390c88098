from hetswarm.client.cli.app import main

main()
