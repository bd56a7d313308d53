"""Objects every rank of a run shares: on rank threads one instance in the run's dict, on rank
processes one instance in the hub that the ranks call through their connections."""
import threading


class AnySource:
    """Receives from any source: senders count what they send to each (group, dst, tag); a
    receive from any source claims the lowest sending rank with a message not yet claimed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = {}     # (group key, dst, tag) -> {src: count}
        self.taken = {}    # the same, by directed receives and any-source claims

    def note_send(self, key, src):
        with self.lock:
            d = self.sent.setdefault(key, {})
            d[src] = d.get(src, 0) + 1

    def note_recv(self, key, src):
        with self.lock:
            d = self.taken.setdefault(key, {})
            d[src] = d.get(src, 0) + 1

    def claim(self, key):
        with self.lock:
            sent, taken = self.sent.get(key, {}), self.taken.setdefault(key, {})
            for src in sorted(sent):
                if sent[src] > taken.get(src, 0):
                    taken[src] = taken.get(src, 0) + 1
                    return src
        return None


class Arrivals:
    """How often each group rank has called a monitored barrier."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = {}

    def arrive(self, rank):
        """Counts this rank's call; returns its number."""
        with self.lock:
            n = self.calls[rank] = self.calls.get(rank, 0) + 1
            return n

    def missing(self, n, size):
        """The group ranks that have not made their n-th call yet."""
        with self.lock:
            return [r for r in range(size) if self.calls.get(r, 0) < n]


KINDS = {"AnySource": AnySource, "Arrivals": Arrivals}


def get(objects, lock, key, kind):
    """The run's object under `key` (made of `kind` on first use)."""
    with lock:
        obj = objects.get(key)
        if obj is None:
            obj = objects[key] = KINDS[kind]()
        return obj
