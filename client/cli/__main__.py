from hetswarm.client.cli import main

main()
