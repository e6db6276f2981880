"""Child process that compiles outlines-core indexes (run as a script, not imported).

Protocol on stdin/stdout, each frame an 8-byte little-endian length plus a pickle:
  parent -> child: first ``(vocabulary, memory_limit_mb)``, then ``(job_id, regex)`` jobs;
  child -> parent: ``("ready",)`` once initialised, then ``(job_id, "ok", index)`` or
  ``(job_id, "err", message)`` per job.
The child exits on EOF (its parent went away).  It never imports torch or radixserve, so it
starts in well under a second; the address-space limit turns a runaway automaton into a
clean failure instead of exhausting the machine's memory.
"""
import os
import pickle
import struct
import sys


def read_frame(f):
    head = f.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


def write_frame(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def main() -> None:
    inp = os.fdopen(0, "rb")  # buffered: read(n) returns n bytes unless EOF
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol
    init = read_frame(inp)
    if init is None:
        return
    vocabulary, mem_mb = init
    if mem_mb:
        try:
            import resource

            limit = int(mem_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    from outlines_core import Index

    write_frame(out, ("ready",))
    while True:
        job = read_frame(inp)
        if job is None:
            return
        job_id, regex = job
        try:
            index = Index(regex, vocabulary)
            write_frame(out, (job_id, "ok", index))
        except MemoryError:
            write_frame(out, (job_id, "err", f"ran out of memory (limit {mem_mb} MB)"))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the parent
            write_frame(out, (job_id, "err", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    sys.exit(main())
