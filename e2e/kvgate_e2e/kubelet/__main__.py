"""``python -m kvgate_e2e.kubelet``: run the loopback kubelet."""

from kvgate_e2e.kubelet.agent import main

if __name__ == "__main__":
    raise SystemExit(main())
