"""argparse value types shared by the scripts: each refuses a bad value with a message that
argparse prefixes with the flag's name (exit 2)."""
import argparse
import math


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
    return value


def at_most(limit, parse):
    """`parse`, refusing values above `limit` (what the program the script runs accepts)."""
    def checked(text):
        value = parse(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"at most {limit}, got '{text}'")
        return value
    return checked


def unique(items, text):
    """`items`, refusing one listed twice (the C++ benches refuse it too: the work would run twice)."""
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"an item is listed twice in '{text}'")
    return items


def name_list(allowed):
    def parse(text):
        items = text.split(",")
        for item in items:
            if item not in allowed:
                raise argparse.ArgumentTypeError(f"expected a list of {', '.join(allowed)}, got '{text}'")
        return unique(items, text)
    return parse


def int_list(text):
    return unique([positive_int(item) for item in text.split(",")], text)


def int_list_at_most(limit):
    """int_list, refusing an item above `limit` (what the program the script runs accepts)."""
    def parse(text):
        items = int_list(text)
        if any(item > limit for item in items):
            raise argparse.ArgumentTypeError(f"each at most {limit}, got '{text}'")
        return items
    return parse
