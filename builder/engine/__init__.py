"""The ground floor: the container engine every step above talks to.

Its address and the protocol the steps program against (protocol.py), the one adapter that
speaks Docker's SDK (docker_adapter.py) and its raw-socket fast path (socket_api.py), what the
engine's host has (hostprobe.py: GPUs, runtimes, memory) and the progress of its long calls
(progress.py); the throwaway containers a step reads an image with (throwaway.py) and the owner
label and reaper of every container the tool starts for itself (owner.py). Below every pipeline
step, so lock/ and render/ may use it as image/ does."""
