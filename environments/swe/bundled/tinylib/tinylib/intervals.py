"""Closed integer intervals as (start, end) pairs."""


def overlaps(first, second):
    return first[0] <= second[1] and second[0] <= first[1]


def merge(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    return sum(end - start + 1 for start, end in merge(intervals))


def contains(intervals, point):
    for start, end in intervals:
        if start <= point <= end:
            return True
    return False
