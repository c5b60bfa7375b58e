"""Shared pieces of the story generator: the story and character state and small sentence helpers.

Kept apart from the plots and the assembly so both can use them without importing each other.
"""

from __future__ import annotations

import functools
import random

from smollab.data import story_words as W

ONE_WORD_GOOD = ("cheerful", "calm", "proud", "brave", "joyful", "gentle", "merry", "bright")
FAMILY = ("mom", "dad", "grandma", "grandpa", "big sister", "little brother", "aunt", "uncle")

_TELL = tuple(v for v in W.SAY if v != "asked")


@functools.cache
def _split(options: str) -> tuple[str, ...]:
    return tuple(options.split("|"))


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


class Char:
    __slots__ = ("ref", "name", "he", "him", "his", "kind", "home", "animal")

    def __init__(self, rng: random.Random, avoid: str = "") -> None:
        r = rng.random()
        self.animal = 0.55 <= r < 0.85
        adj = rng.choice(W.PERSON_ADJ if r < 0.55 else W.CHAR_ADJ)
        if r < 0.55:
            girl = rng.random() < 0.5
            self.kind = "girl" if girl else "boy"
            self.name = rng.choice(W.GIRL_NAMES if girl else W.BOY_NAMES)
            self.he, self.him, self.his = ("she", "her", "her") if girl else ("he", "him", "his")
            self.ref = rng.choice(
                (
                    f"a {self.kind} named {self.name}",
                    f"a little {self.kind} called {self.name}",
                    f"{article(adj)} {self.kind} named {self.name}",
                    self.name,
                )
            )
            self.home = rng.choice(W.HOMES_PERSON)
        else:
            animal = r < 0.85
            self.kind = rng.choice(W.ANIMALS if animal else W.BEINGS)
            if self.kind in W.IT_BEINGS:
                self.he, self.him, self.his = "it", "it", "its"
            elif self.kind in W.SHE_BEINGS or (self.kind not in W.HE_BEINGS and rng.random() < 0.5):
                self.he, self.him, self.his = "she", "her", "her"
            else:
                self.he, self.him, self.his = "he", "him", "his"
            if rng.random() < 0.6:
                bank = (
                    W.PET_NAMES if animal else (W.GIRL_NAMES if self.he == "she" else W.BOY_NAMES)
                )
                self.name = rng.choice(bank)
                self.ref = f"{article(adj)} {self.kind} named {self.name}"
            else:
                self.name = f"the {self.kind}"
                self.ref = f"{article(adj)} {self.kind}"
            self.home = rng.choice(W.HOMES_ANIMAL if animal else W.HOMES_BEING)
        if self.name == avoid:  # a friend never shares the hero's name
            self.name, self.ref = f"the {self.kind}", f"{article(adj)} {self.kind}"


class Story:
    def __init__(self, rng: random.Random, plan: str | None) -> None:
        self.rng = rng
        self.plan = plan  # None, "early" or "late"
        self.parts: list[str] = []
        self.words = 0
        self.happy = False
        self.intro_end = 1

    def add(self, *sentences: str) -> None:
        for s in sentences:
            self.parts.append(s)
            self.words += s.count(" ") + 1

    def c(self, seq):
        return self.rng.choice(seq)

    def pick(self, options: str) -> str:
        """One of the "|"-separated options."""
        return self.rng.choice(_split(options))

    def p(self, prob: float) -> bool:
        return self.rng.random() < prob

    def good(self, stage: str = "mid", one_word: bool = False) -> str:
        """A positive feeling; "happy" where this story's plan puts it."""
        if not self.happy and (
            (self.plan == "early" and stage != "end" and self.words <= 45)
            or (self.plan == "late" and stage == "end")
        ):
            self.happy = True
            return "happy"
        return self.c(ONE_WORD_GOOD if one_word else W.GOOD_FEELINGS)

    def bad(self) -> str:
        return self.c(W.BAD_FEELINGS)

    def say(self, who: Char, line: str, verb: str | None = None) -> None:
        """Add a line of dialogue in one of several shapes."""
        if verb is None:
            verb = "asked" if line.endswith("?") else self.c(_TELL)
        k = self.rng.random()
        if k < 0.45:
            body = line[:-1] + "," if line.endswith(".") else line
            self.add(f'"{body}" {verb} {who.name}.')
        elif k < 0.7:
            self.add(f'{who.name} {verb}, "{line}"')
        else:
            body = line[:-1] + "," if line.endswith(".") else line
            self.add(f'"{body}" {who.he} {verb}.')

    def then(self) -> str:
        return self.c(W.CONNECT)


def some_object(st: Story) -> str:
    return f"{st.c(W.COLORS if st.p(0.5) else W.OBJ_ADJ)} {st.c(W.OBJECTS)}"


def some_place(st: Story) -> tuple[str, str, tuple[str, ...]]:
    name = st.c(tuple(W.PLACES))
    prep, sights = W.PLACES[name]
    return name, prep, sights


def detail(st: Story, who: Char) -> None:
    """One sentence of colour, drawn from wide word banks (variety and vocabulary)."""
    k = st.rng.randrange(20)
    if k == 14:
        st.add(f"{who.he} remembered the day {st.c(W.MEMORIES)}.")
    elif k == 15:
        st.add(f"first, {who.he} had to {st.c(W.CHORES)} and {st.c(W.CHORES)}.")
    elif k == 16:
        st.add(f"{who.he} read a book about {st.c(W.BOOK_TOPICS)}.")
    elif k == 17:
        st.add(f"{who.he} dreamed of becoming {article(st.c(W.JOBS))} one day.")
    elif k == 18:
        st.add(f"{who.he} {st.c(W.GESTURES).format(his=who.his)}.")
    elif k == 19:
        day = st.c(W.DAYS) if st.p(0.5) else f"a day in {st.c(W.MONTHS)}"
        st.add(f"it was {day}, and {who.he} had no plans at all.")
    elif k >= 10:
        adj, thing = st.c(W.ADJECTIVES), st.c(W.SMALL_THINGS)
        if k == 10:
            st.add(f"{who.he} found {article(adj)} {thing} {st.c(W.HIDING_SPOTS)}.")
        elif k == 11:
            st.add(f"{who.he} {st.c(W.HANDLE_VERBS)} {article(adj)} {thing} {st.c(W.ADVERBS)}.")
        elif k == 12:
            st.add(f"far away, {who.he} could see {article(adj)} {st.c(W.LANDMARKS)}.")
        else:
            st.add(f"{who.he} picked up {article(adj)} {thing} and put it in {who.his} pocket.")
    elif k == 0:
        st.add(f"{who.he} wore {article(st.c(W.COLORS))} {st.c(W.CLOTHES)}.")
    elif k == 1:
        st.add(f"{who.he} {st.c(W.MOTIONS)} {st.c(W.PATHS)}.")
    elif k == 2:
        st.add(f"nearby, {st.c(W.CRITTER_ACTS)}.")
    elif k == 3:
        st.add(f"the {st.c(W.FLOWERS)} under the {st.c(W.TREES)} tree were in bloom.")
    elif k == 4:
        st.add(f"{who.he} ate some {st.c(W.FOODS)} and drank {st.c(W.DRINKS)}.")
    elif k == 5:
        st.add(f"{who.he} counted {st.c(W.NUMBERS)} {st.c(W.COUNTABLES)}.")
    elif k == 6:
        st.add(f"for a while, {who.he} thought about {st.c(W.THOUGHTS)}.")
    elif k == 7:
        st.add(f"a cloud in the sky looked just like {st.c(W.SHAPES)}.")
    elif k == 8:
        st.add(f"somewhere, someone was playing {article(st.c(W.INSTRUMENTS))}.")
    else:
        st.add(f"{article(st.c(W.VEHICLES))} went by, and {who.he} waved.")


def scene(st: Story, who: Char, sights: tuple[str, ...]) -> None:
    """Zero to three sentences of what the place looks, sounds or smells like."""
    for _ in range(st.rng.randrange(4)):
        k = st.rng.randrange(6)
        if k == 0:
            s1, s2 = st.rng.sample(sights, 2)
            st.add(f"there were {s1} and {s2}.")
        elif k == 1:
            st.add(f"{who.he} could hear {st.c(W.SOUNDS)}.")
        elif k == 2:
            st.add(f"the air smelled of {st.c(W.SMELLS)}.")
        elif k == 3:
            st.add(st.c(W.WEATHER))
        elif k == 4:
            st.add(f"{who.he} saw {st.c(sights)}.")
        else:
            detail(st, who)
