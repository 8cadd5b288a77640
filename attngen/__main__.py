from .cli import main

if __name__ == "__main__":     # not when a verify worker process is spawned
    main()
