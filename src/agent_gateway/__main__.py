from agent_gateway.cli.main import main

main()
