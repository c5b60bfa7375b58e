"""A bundled, offline generator of lower-case children's stories in the SimpleStories spirit.

`generate_stories(n, seed)` is deterministic by seed and needs no network. Each story has an
opening (varied: "once upon a time", "one morning", names first, ...), a hero and often a friend,
a place, a problem or event drawn from sixteen plot types, dialogue in quotes, a resolution and an
ending. Feelings are everywhere, but "happy" is rationed: each story is planned as "early" (happy
within roughly the first 50 words, about a fifth of stories), "late" (only near the end) or none
(about two thirds), because a GRPO reward counts "happy" and must start from a moderate rate.
This module holds the openings, endings, that planning and the assembly; the shared state and
helpers are in `story_kit`, the plot types (story arcs) in `story_arcs`.
"""

from __future__ import annotations

import random

from smollab.data import story_words as W
from smollab.data.story_arcs import PLOTS
from smollab.data.story_kit import FAMILY, Char, Story, article, detail, some_object

P_EARLY = 0.21  # share of stories with "happy" near the start
P_LATE = 0.13  # share with "happy" only near the end
LOOKS_PERSON = (
    "bright eyes",
    "a loud voice",
    "a warm smile",
    "curly hair",
    "a red cap",
    "muddy boots",
    "freckles on the nose",
    "long braids",
    "a gap in the teeth",
    "big round glasses",
)
LOOKS_OTHER = (
    "soft brown fur",
    "bright eyes",
    "a long bushy tail",
    "big floppy ears",
    "tiny paws",
    "a spotted coat",
    "a loud voice",
    "shiny scales",
    "fluffy feathers",
    "a tiny nose",
)


def _opening(st: Story, h: Char) -> None:
    k = st.rng.randrange(16)
    home, time = h.home, st.c(W.TIMES)
    if k == 0:
        st.add(f"once upon a time, there was {h.ref}.")
    elif k == 1:
        st.add(f"once upon a time, {home}, there lived {h.ref}.")
    elif k == 2:
        st.add(f"{time}, {h.ref} woke up early.")
    elif k == 3:
        st.add(
            f"in {st.pick('a small town|a quiet village|a big city|a land far away')}, there lived {h.ref}."
        )
    elif k == 4:
        st.add(f"there was {h.ref} who lived {home}.")
    elif k == 5:
        st.add(f"long ago, {h.ref} lived {home}.")
    elif k == 6:
        st.add(f"{h.ref} lived {home}.")
    elif k == 7:
        st.add(f"every morning, {h.ref} {st.c(W.HOBBIES)[1]}.")
    elif k == 8:
        st.add(f"{h.ref} had {article(some_object(st))} that {h.he} loved very much.")
    elif k == 9:
        st.add(f"far away, beyond the {st.pick('hills|sea|mountains|woods')}, there lived {h.ref}.")
    elif k == 10:
        st.add(
            f"at the edge of {st.pick('the forest|the town|a deep lake|a wide field')}, there lived {h.ref}."
        )
    elif k == 11:
        st.add(f"not long ago, there was {h.ref}.")
    elif k == 12:
        st.add(f"{time}, {h.ref} went for a walk.")
    elif k == 13:
        st.add(f"this is a story about {h.ref}.")
    elif k == 14:
        st.add(st.c(W.WEATHER), f"{h.ref} looked out of the window.")
    else:
        st.add(
            f"{time}, {h.ref} sat outside and {st.pick('thought|waited|listened|looked around')}."
        )
    hob = st.c(W.HOBBIES)
    n = st.rng.randrange(1, 4)
    forced = st.rng.randrange(n) if st.plan == "early" else -1
    for i in range(n):
        k = 2 if i == forced else st.rng.randrange(8)
        if k == 0:
            st.add(f"{h.he} was {st.c(W.TRAITS)}.")
        elif k == 1:
            st.add(f"{h.he} loved {hob[0]} more than anything.")
        elif k == 2:
            j = st.rng.randrange(4)
            if j == 0:
                st.add(f"every day, {h.he} felt {st.good('intro')} when {h.he} {hob[1]}.")
            elif j == 1:
                st.add(f"{hob[0]} always made {h.him} feel {st.good('intro')}.")
            elif j == 2:
                st.add(f"{h.he} was {article(st.good('intro', True))} {h.kind} who liked {hob[0]}.")
            else:
                st.add(f"{h.name} was always {st.good('intro')} on days like this.")
        elif k == 3:
            st.add(f"{h.he} lived with {h.his} {st.c(FAMILY)}.")
        elif k == 4:
            looks = LOOKS_OTHER if h.animal else LOOKS_PERSON
            st.add(f"{h.he} had {st.c(looks)}.")
        elif k == 5:
            st.add(f"{h.he} {hob[1]} every day.")
        elif k == 6:
            st.add(f"{h.his} favorite food was {st.c(W.MEALS)}.")
        else:
            detail(st, h)


def _ending(st: Story, h: Char, f: Char) -> None:
    if not any(f.name in p for p in st.parts):  # never met: no friend in the ending
        f = h
    if st.plan == "late" or st.p(0.4):
        k = st.rng.randrange(4)
        if k == 0:
            st.add(f"{h.name} felt {st.good('end')} as the sun went down.")
        elif k == 1:
            st.add(f"everyone was {st.good('end')} that day.")
        elif k == 2 and f is not h:
            st.add(f"{h.name} and {f.name} were {st.good('end')} together.")
        else:
            st.add(f"{h.he} went home tired but {st.good('end')}.")
    else:
        st.add(
            st.c(
                (
                    f"from that day on, {h.name} and {f.name} were the best of friends."
                    if f is not h
                    else f"{h.name} smiled all the way home.",
                    f"that night, {h.name} went to bed with a big smile.",
                    f"{h.name} learned that {st.c(W.LESSONS)}.",
                    "and they all lived happily ever after.",
                    "it was the best day ever.",
                    f"{h.he} could not wait for tomorrow.",
                    f"{h.name} would never forget that day.",
                    "the sun went down, and the stars came out one by one.",
                )
            )
        )
    if st.p(0.35):
        st.add(
            st.c((f"{h.name} learned that {st.c(W.LESSONS)}.", "the end.", "it was a good day."))
        )


def _force_happy(st: Story, h: Char) -> None:
    """The plan wanted "happy" but no slot took it: add a fitting sentence where the plan says."""
    if st.plan == "early":
        counts, total = [], 0
        for s in st.parts:
            total += s.count(" ") + 1
            counts.append(total)
        spots = [i + 1 for i, c in enumerate(counts[: st.intro_end]) if 6 <= c <= 45] or [1]
        line = st.c(
            (
                f"{h.he} was happy.",
                f"{h.name} was a happy {h.kind}.",
                f"{h.he} felt happy and free.",
            )
        )
        st.parts.insert(st.c(spots), line)
    else:
        st.parts.insert(
            len(st.parts) - 1, st.c((f"{h.name} was happy again.", "everyone was happy."))
        )
    st.happy = True


def _one(rng: random.Random) -> str:
    u = rng.random()
    plan = "early" if u < P_EARLY else "late" if u < P_EARLY + P_LATE else None
    st = Story(rng, plan)
    hero = Char(rng)
    friend = Char(rng, avoid=hero.name)
    _opening(st, hero)
    st.intro_end = len(st.parts)
    rng.choice(PLOTS)(st, hero, friend)
    _ending(st, hero, friend)
    if plan and not st.happy:
        _force_happy(st, hero)
    return " ".join(st.parts)


def generate_stories(n: int, seed: int = 0) -> list[str]:
    """`n` stories, the same for the same seed (lower-case, punctuation kept, single spaces)."""
    rng = random.Random(seed)
    return [_one(rng) for _ in range(n)]
