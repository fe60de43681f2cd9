"""Entry point of a transfer worker process (`python -m gpucompute._worker_main`; see
gpucompute._workers). A module of its own, which the package does not import, so that running
it does not import it twice."""

from gpucompute._workers import main

if __name__ == "__main__":
    main()
