from bench.regimes.study import main

main()
