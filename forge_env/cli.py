"""forge-env command line."""
import sys


def main(argv=None) -> int:
    print("forge-env: demo not built yet")
    return 1
if __name__ == "__main__":
    sys.exit(main())
