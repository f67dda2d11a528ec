#!/usr/bin/env python3
"""Writes data/tiny_corpus.txt, dsplan's bundled training corpus.

Everything in the corpus comes from the word lists and templates below; nothing is read from
anywhere. The output is deterministic: the script carries its own SplitMix64 generator (the same
algorithm as executor/src/data/rng.rs), so any Python 3 produces the same bytes.

    python3 data/generate_tiny_corpus.py            # rewrites data/tiny_corpus.txt
    python3 data/generate_tiny_corpus.py --check    # exits 1 if the file is stale

The text mixes four kinds of paragraphs a tiny byte-level model can learn something from:
plain sentences, short stories whose numbers add up, arithmetic facts, and counting.
"""

import pathlib
import sys

SEED = 20240520
TARGET_BYTES = 200_000
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, bound):
        return (self.next_u64() * bound) >> 64

    def pick(self, items):
        return items[self.below(len(items))]


NAMES = ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena",
         "Max", "Nora", "Otto", "Pia", "Rosa", "Sam", "Tom", "Uma", "Vic", "Will", "Yara", "Zoe"]
ANIMALS = ["cat", "dog", "bird", "fox", "horse", "goat", "duck", "frog", "mouse", "owl", "bee",
           "sheep", "cow", "hen", "fish", "bear"]
THINGS = ["ball", "box", "cup", "book", "hat", "kite", "boat", "drum", "lamp", "key", "coin",
          "shell", "stone", "rope", "bell", "map"]
FRUITS = ["apple", "pear", "plum", "lemon", "peach", "orange", "cherry", "melon"]
PLACES = ["the park", "the garden", "the barn", "the river", "the hill", "the market",
          "the school", "the forest", "the beach", "the town"]
ADJECTIVES = ["small", "big", "red", "blue", "green", "old", "new", "quiet", "happy", "sleepy",
              "yellow", "brown", "white", "black", "tall", "round"]
VERBS_PAST = ["saw", "found", "liked", "carried", "painted", "washed", "hid", "wanted",
              "dropped", "kept", "lost", "fixed"]
MOVES = ["ran", "walked", "jumped", "swam", "flew", "climbed", "rolled", "hopped"]
TIMES = ["In the morning", "At noon", "In the evening", "At night", "One day", "Later",
         "After lunch", "Before dinner"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy", "snowy", "hot"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]


def plural(noun, count):
    if count == 1:
        return noun
    if noun.endswith(("sh", "ch", "x", "s")):
        return noun + "es"
    if noun in ("sheep", "fish"):
        return noun
    if noun == "mouse":
        return "mice"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def article(word):
    return "an" if word[0] in "aeiou" else "a"


def sentences(rng):
    lines = []
    for _ in range(4 + rng.below(3)):
        kind = rng.below(5)
        name = rng.pick(NAMES)
        adjective = rng.pick(ADJECTIVES)
        if kind == 0:
            thing = rng.pick(THINGS)
            lines.append(f"{name} {rng.pick(VERBS_PAST)} {article(adjective)} {adjective} {thing}.")
        elif kind == 1:
            animal = rng.pick(ANIMALS)
            lines.append(f"The {adjective} {animal} {rng.pick(MOVES)} to {rng.pick(PLACES)}.")
        elif kind == 2:
            lines.append(f"{rng.pick(TIMES)} it was {rng.pick(WEATHER)}, so {name} stayed at "
                         f"{rng.pick(PLACES)}.")
        elif kind == 3:
            other = rng.pick(NAMES)
            if other == name:
                other = NAMES[(NAMES.index(name) + 1) % len(NAMES)]
            lines.append(f"{name} and {other} played with the {rng.pick(ANIMALS)}.")
        else:
            fruit = rng.pick(FRUITS)
            lines.append(f"{name} ate {article(fruit)} {fruit} and felt {rng.pick(ADJECTIVES)}.")
    return " ".join(lines)


def story(rng):
    name = rng.pick(NAMES)
    friend = rng.pick([n for n in NAMES if n != name])
    fruit = rng.pick(FRUITS)
    have = 2 + rng.below(9)
    give = 1 + rng.below(have - 1)
    found = rng.below(5)
    left = have - give
    total = left + found
    text = (f"{name} had {NUMBER_WORDS[have]} {plural(fruit, have)}. "
            f"{name} gave {NUMBER_WORDS[give]} to {friend}. "
            f"Now {name} has {NUMBER_WORDS[left]} {plural(fruit, left)} and {friend} has "
            f"{NUMBER_WORDS[give]}.")
    if found:
        text += (f" Then {name} found {NUMBER_WORDS[found]} more at {rng.pick(PLACES)}, "
                 f"so {name} has {NUMBER_WORDS[total]} {plural(fruit, total)}.")
    return text


def arithmetic(rng):
    facts = []
    for _ in range(5 + rng.below(4)):
        a = rng.below(20)
        b = rng.below(20)
        op = rng.below(4)
        if op == 0:
            facts.append(f"{a} plus {b} is {a + b}.")
        elif op == 1:
            big, small = max(a, b), min(a, b)
            facts.append(f"{big} minus {small} is {big - small}.")
        elif op == 2:
            x, y = a % 13, b % 13
            facts.append(f"{x} times {y} is {x * y}.")
        else:
            y = 1 + b % 12
            q = a % 13
            facts.append(f"{q * y} divided by {y} is {q}.")
    return " ".join(facts)


def counting(rng):
    start = rng.below(12)
    length = 4 + rng.below(6)
    if rng.below(2):
        words = NUMBER_WORDS[start:start + length]
        return ", ".join(words).capitalize() + "."
    step = 1 + rng.below(5)
    numbers = [str(start + i * step) for i in range(length)]
    return f"Counting by {step}: " + ", ".join(numbers) + "."


def corpus():
    rng = SplitMix64(SEED)
    makers = [sentences, story, arithmetic, counting]
    out = []
    size = 0
    while size < TARGET_BYTES:
        paragraph = rng.pick(makers)(rng) + "\n\n"
        out.append(paragraph)
        size += len(paragraph)
    return "".join(out)


def main():
    path = pathlib.Path(__file__).with_name("tiny_corpus.txt")
    text = corpus().encode("ascii")
    if "--check" in sys.argv[1:]:
        if path.read_bytes() != text:
            print(f"{path} is stale: run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    path.write_bytes(text)
    print(f"wrote {path} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
