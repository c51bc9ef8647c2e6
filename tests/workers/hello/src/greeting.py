"""A second module beside main: importable because main's folder is on the path."""


def make_greeting(word: str, name: str) -> str:
    return f"{word}, {name}!"
