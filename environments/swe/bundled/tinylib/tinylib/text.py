"""Text helpers."""


def slugify(text):
    words = []
    current = []
    for char in text.lower():
        if char.isalnum():
            current.append(char)
        elif current:
            words.append("".join(current))
            current = []
    if current:
        words.append("".join(current))
    return "-".join(words)


def truncate(text, width, marker="..."):
    if width < len(marker):
        raise ValueError("width is smaller than the marker")
    if len(text) <= width:
        return text
    return text[:width - len(marker)] + marker


def wrap(text, width):
    lines = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        elif line:
            line = line + " " + word
        else:
            line = word
    if line:
        lines.append(line)
    return lines


def count_words(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
