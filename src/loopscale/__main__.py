from loopscale.cli import main

main()
