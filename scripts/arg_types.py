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


def name_list(allowed):
    def parse(text):
        items = text.split(",")
        for item in items:
            if item not in allowed:
                raise argparse.ArgumentTypeError(f"expected a list of {', '.join(allowed)}, got '{text}'")
        return items
    return parse


def int_list(text):
    return [positive_int(item) for item in text.split(",")]
