"""A least-recently-used cache."""


class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.items = {}
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        if key in self.items:
            value = self.items.pop(key)
            self.items[key] = value
            self.hits += 1
            return value
        self.misses += 1
        return default

    def put(self, key, value):
        if key in self.items:
            self.items.pop(key)
        elif len(self.items) >= self.capacity:
            oldest = next(iter(self.items))
            del self.items[oldest]
        self.items[key] = value

    def __len__(self):
        return len(self.items)
