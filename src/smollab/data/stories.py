"""A bundled, offline generator of lower-case children's stories in the SimpleStories spirit.

`generate_stories(n, seed)` is deterministic by seed and needs no network. Each story has an
opening (varied: "once upon a time", "one morning", names first, ...), a hero and often a friend,
a place, a problem or event drawn from sixteen plot types, dialogue in quotes, a resolution and an
ending. Feelings are everywhere, but "happy" is rationed: each story is planned as "early" (happy
within roughly the first 50 words, about a fifth of stories), "late" (only near the end) or none
(about two thirds), because a GRPO reward counts "happy" and must start from a moderate rate.
"""

from __future__ import annotations

import functools
import random

from smollab.data import story_words as W

P_EARLY = 0.21  # share of stories with "happy" near the start
P_LATE = 0.13  # share with "happy" only near the end

ONE_WORD_GOOD = ("cheerful", "calm", "proud", "brave", "joyful", "gentle", "merry", "bright")
FAMILY = ("mom", "dad", "grandma", "grandpa", "big sister", "little brother", "aunt", "uncle")
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


_TELL = tuple(v for v in W.SAY if v != "asked")


@functools.cache
def _split(options: str) -> tuple[str, ...]:
    return tuple(options.split("|"))


def _a(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


class _Char:
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
                    f"{_a(adj)} {self.kind} named {self.name}",
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
                self.ref = f"{_a(adj)} {self.kind} named {self.name}"
            else:
                self.name = f"the {self.kind}"
                self.ref = f"{_a(adj)} {self.kind}"
            self.home = rng.choice(W.HOMES_ANIMAL if animal else W.HOMES_BEING)
        if self.name == avoid:  # a friend never shares the hero's name
            self.name, self.ref = f"the {self.kind}", f"{_a(adj)} {self.kind}"


class _Story:
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

    def say(self, who: _Char, line: str, verb: str | None = None) -> None:
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


def _obj(st: _Story) -> str:
    return f"{st.c(W.COLORS if st.p(0.5) else W.OBJ_ADJ)} {st.c(W.OBJECTS)}"


def _place(st: _Story) -> tuple[str, str, tuple[str, ...]]:
    name = st.c(tuple(W.PLACES))
    prep, sights = W.PLACES[name]
    return name, prep, sights


def _detail(st: _Story, who: _Char) -> None:
    """One sentence of colour, drawn from wide word banks (variety and vocabulary)."""
    k = st.rng.randrange(20)
    if k == 14:
        st.add(f"{who.he} remembered the day {st.c(W.MEMORIES)}.")
    elif k == 15:
        st.add(f"first, {who.he} had to {st.c(W.CHORES)} and {st.c(W.CHORES)}.")
    elif k == 16:
        st.add(f"{who.he} read a book about {st.c(W.BOOK_TOPICS)}.")
    elif k == 17:
        st.add(f"{who.he} dreamed of becoming {_a(st.c(W.JOBS))} one day.")
    elif k == 18:
        st.add(f"{who.he} {st.c(W.GESTURES).format(his=who.his)}.")
    elif k == 19:
        day = st.c(W.DAYS) if st.p(0.5) else f"a day in {st.c(W.MONTHS)}"
        st.add(f"it was {day}, and {who.he} had no plans at all.")
    elif k >= 10:
        adj, thing = st.c(W.ADJECTIVES), st.c(W.SMALL_THINGS)
        if k == 10:
            st.add(f"{who.he} found {_a(adj)} {thing} {st.c(W.HIDING_SPOTS)}.")
        elif k == 11:
            st.add(f"{who.he} {st.c(W.HANDLE_VERBS)} {_a(adj)} {thing} {st.c(W.ADVERBS)}.")
        elif k == 12:
            st.add(f"far away, {who.he} could see {_a(adj)} {st.c(W.LANDMARKS)}.")
        else:
            st.add(f"{who.he} picked up {_a(adj)} {thing} and put it in {who.his} pocket.")
    elif k == 0:
        st.add(f"{who.he} wore {_a(st.c(W.COLORS))} {st.c(W.CLOTHES)}.")
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
        st.add(f"somewhere, someone was playing {_a(st.c(W.INSTRUMENTS))}.")
    else:
        st.add(f"{_a(st.c(W.VEHICLES))} went by, and {who.he} waved.")


def _scene(st: _Story, who: _Char, sights: tuple[str, ...]) -> None:
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
            _detail(st, who)


def _opening(st: _Story, h: _Char) -> None:
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
        st.add(f"{h.ref} had {_a(_obj(st))} that {h.he} loved very much.")
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
                st.add(f"{h.he} was {_a(st.good('intro', True))} {h.kind} who liked {hob[0]}.")
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
            _detail(st, h)


def _plot_lost(st: _Story, h: _Char, f: _Char) -> None:
    obj = _obj(st).split()[-1] if st.p(0.3) else _obj(st)
    place, prep, sights = _place(st)
    st.add(f"{st.then()}, {h.name} took {h.his} {obj} to {place}.")
    _scene(st, h, sights)
    st.add(f"{h.he} {st.c(W.HOBBIES)[1]} until the sun was low.")
    st.add(f"but when {h.he} looked for {h.his} {obj}, it was gone!")
    st.add(f"{h.name} felt {st.bad()}.")
    st.say(h, f"where is my {obj}?")
    st.add(f"just then, {f.ref} came by.")
    st.say(f, "what is wrong?")
    st.say(h, f"i lost my {obj}.")
    st.say(f, "do not worry. i will help you look.")
    a, b, c = st.rng.sample(W.HIDING_SPOTS, 3)
    st.add(f"they looked {a}. they looked {b}.", f"but the {obj} was not there.")
    if st.p(0.5):
        st.add(f"at last, {f.name} found it {c}!")
    else:
        st.add(f"then {h.name} saw something {c}. it was the {obj}!")
    if st.p(0.3):
        st.say(h, f"i feel {st.good()} now!")
    else:
        st.say(h, st.pick("thank you so much!|you are a good friend!|there it is!"))


def _plot_friend(st: _Story, h: _Char, f: _Char) -> None:
    place, prep, sights = _place(st)
    st.add(f"but {h.name} had no one to play with, and {h.he} felt {st.pick('lonely|sad|bored')}.")
    st.add(f"{st.then()}, {h.he} went to {place}.")
    _scene(st, h, sights)
    st.add(f"there {h.he} met {f.ref}, who was sitting all alone.")
    st.say(h, "hello! what is your name?")
    st.say(f, f"i am {f.name}. i am new here.")
    st.say(h, f"do you want to {st.c(W.HOBBIES)[2]} with me?")
    st.add(f"{f.name} smiled and nodded.")
    st.add(f"they {st.c(W.HOBBIES)[1]} and {st.c(W.HOBBIES)[1]} all afternoon.")
    if st.p(0.5):
        st.add(f"when it was time to go home, {h.name} felt {st.good()}.")
    st.say(f, st.pick("can we play again tomorrow?|you are my first friend here.|this was fun!"))


def _plot_explore(st: _Story, h: _Char, f: _Char) -> None:
    place, prep, sights = _place(st)
    st.add(f"{st.then()}, {h.name} decided to explore {place}.")
    _scene(st, h, sights)
    st.add(f"{h.he} walked past {st.c(sights)} and kept going.")
    t = st.c(W.TREASURES)
    st.add(f"suddenly, {h.he} found {t}!", f"{h.name} felt {st.c(W.MID_FEELINGS)}.")
    st.say(
        h,
        st.pick("wow, what is this?|i have never seen anything like it!|who left this here?"),
    )
    st.add(f"{h.he} ran to show {h.his} {st.c(FAMILY)}.")
    if st.p(0.5):
        st.add(f"on the way, {h.he} met {f.ref}, and they looked at it together.")
    st.add(
        st.c(
            (
                f"they decided to keep it safe {st.c(W.HIDING_SPOTS)}.",
                "they put it back where it belonged, so others could find it too.",
                "it became the most special thing in the whole house.",
            )
        )
    )


def _plot_storm(st: _Story, h: _Char, f: _Char) -> None:
    ev = st.c(W.EVENTS)
    st.add(f"{h.name} and {f.ref} were getting ready for {ev}.")
    st.add("but dark clouds filled the sky.", "thunder rumbled, and rain began to pour.")
    st.add(f"{h.name} felt {st.bad()}.")
    st.say(h, st.pick("now everything is ruined!|what will we do now?|oh no, the rain!"))
    st.say(f, st.pick("let us wait inside. the rain will stop.|we can still have fun."))
    st.add(
        f"they {st.pick('sang songs|played games|told stories|made a fort of pillows|baked cookies')} while the storm went on."
    )
    st.add(f"{st.then()}, the rain stopped.", "a big rainbow stretched across the sky.")
    st.say(h, "look! a rainbow!")
    the_ev = "the " + ev[2:] if ev.startswith("a ") else ev
    st.add(f"in the end, {the_ev} was even better than they had hoped.")


def _plot_skill(st: _Story, h: _Char, f: _Char) -> None:
    skill, win, fail = st.c(W.SKILLS)
    st.add(f"more than anything, {h.name} wanted to learn to {skill}.")
    st.add(f"{h.he} tried, but {h.he} {fail}.", f"{h.he} tried again, and again {h.he} {fail}.")
    st.add(f"{h.name} felt {st.pick('frustrated|sad|tired|angry|upset')}.")
    st.say(h, st.pick("i will never learn!|this is too hard!|why can i not do it?"))
    helper = f if st.p(0.5) else None
    who = helper.name if helper else f"{h.his} {st.c(FAMILY)}"
    st.add(f"{helper.ref if helper else who} sat down next to {h.him}.")
    line = st.pick(
        "everyone falls at first. try once more.|go slowly, and do not give up.|i could not do it either, when i was little."
    )
    if helper:
        st.say(helper, line)
    else:
        st.add(f'"{line[:-1]}," said {who}.')
    st.add(
        f"so {h.name} practiced every day, even when it was {st.pick('cold|raining|late|hard')}."
    )
    st.add(f"one day, {h.he} {win}!", f"{h.name} felt {st.good()}.")


def _plot_help(st: _Story, h: _Char, f: _Char) -> None:
    need, state, fix = st.c(W.HELP_NEEDS)
    place, prep, sights = _place(st)
    st.add(f"{st.then()}, {h.name} was walking {prep} {place} when {h.he} saw {need}.")
    st.add(f"{state}.", f"{h.name} felt {st.pick('worried|sad|sorry')}.")
    st.say(
        h,
        st.pick("do not be afraid. i will help you.|oh, you poor thing!|hold on, i am coming!"),
    )
    st.add(f"{h.he} {fix}.")
    if st.p(0.6):
        st.add(f"{st.then()}, {f.ref} came to help too.")
    st.say(h, st.pick("there you go. you are safe now.|all better!|now you can go home."))
    st.add(f"it was a small thing, but {h.name} felt {st.good()}.")


def _plot_fear(st: _Story, h: _Char, f: _Char) -> None:
    fear, trigger, truth = st.c(W.FEARS)
    st.add(f"but {h.name} was afraid of {fear}.")
    st.add(
        f"{st.then()}, {trigger}.",
        f"{h.name} felt very {st.pick('scared|afraid|nervous|frightened')}.",
    )
    st.say(h, st.pick("i want to go home!|help!|what is that?"))
    st.add(f"{f.ref} held {h.his} hand.")
    st.say(f, "let us look together. there is nothing to fear.")
    st.add(f"so they looked closely, and {h.name} saw that {truth}.")
    st.add(f"{h.he} took a deep breath and felt {st.pick('calm|brave|safe|better')}.")
    st.say(
        h,
        st.pick("that was not so bad!|i am not afraid anymore.|thank you for staying with me."),
    )


def _plot_share(st: _Story, h: _Char, f: _Char) -> None:
    obj = _obj(st)
    st.add(f"one day, {h.name} and {f.ref} found {_a(obj)} in the yard.")
    st.say(h, "it is mine! i saw it first!")
    st.say(f, "no, it is mine!")
    st.add(f"they pulled and pulled, and both felt {st.pick('angry|grumpy|upset')}.")
    if st.p(0.5):
        st.add(f"the {obj.split()[-1]} fell into the mud.")
    st.add(f"{st.then()}, {h.name} stopped.")
    st.say(
        h,
        st.pick("maybe we can take turns.|what if we share it?|let us play with it together."),
    )
    st.add(f"{f.name} thought for a moment and smiled.")
    st.add("they played together until dinner, and it was twice as much fun.")


def _plot_event(st: _Story, h: _Char, f: _Char) -> None:
    ev = st.c(W.EVENTS)
    food = st.c(W.FOODS)
    st.add(f"tomorrow was {ev}, and {h.name} was very {st.pick('excited|eager|busy')}.")
    st.add(f"{h.he} wanted to bring {food} for everyone.")
    st.add(f"but when {h.he} opened the basket, the {food} were gone!")
    st.say(h, st.pick("oh no! what happened?|who took them?"))
    st.add(f"then {h.he} saw {f.ref} with crumbs on {f.his} face.")
    st.say(f, st.pick("i am sorry. they smelled so good!|i was so hungry. i am sorry."))
    st.add(f"{h.name} was {st.pick('upset|cross|sad')} at first, but then {h.he} laughed.")
    st.add(f"together they went to get more {food}, and this time they got enough for two.")
    st.add("the next day, everyone loved them.")


def _plot_build(st: _Story, h: _Char, f: _Char) -> None:
    thing, oops = st.c(W.BUILDS)
    st.add(f"{st.then()}, {h.name} decided to make {thing}.")
    st.add(f"{h.he} worked all morning.", f"it was {st.pick('tall|beautiful|strong|perfect')}.")
    st.add(f"but then {oops}.", f"{h.name} felt {st.bad()}.")
    st.say(h, st.pick("all my work is gone!|it is ruined!"))
    st.add(f"{f.ref} came over and looked at the mess.")
    st.say(
        f,
        st.pick("we can make a new one together.|let me help you. two hands are better than one."),
    )
    st.add("this time they made it even bigger and better.")
    st.add(f"when it was done, {h.name} felt {st.good()}.")


def _plot_quest(st: _Story, h: _Char, f: _Char) -> None:
    goal = st.pick(
        "the top of the tall hill|the end of the rainbow|the oldest tree in the forest|the lost lake|the other side of the river"
    )
    st.add(f"{h.name} wanted to find {goal}.")
    st.add(f"{h.he} packed {st.c(W.FOODS)} and {_a(st.c(W.OBJECTS))}, and set off.")
    for _ in range(st.rng.randrange(1, 3)):
        place, prep, sights = _place(st)
        st.add(f"first {h.he} walked to {place}, past {st.c(sights)}.")
    st.add(f"the path was long, and {h.name} felt {st.pick('tired|hungry|lost|worried')}.")
    st.add(f"then {h.he} met {f.ref}.")
    st.say(f, "i know the way. follow me!")
    st.add(f"together they walked and walked until they reached {goal}.")
    st.add(f"it was more beautiful than {h.name} had ever imagined.", f"{h.he} felt {st.good()}.")


def _plot_mystery(st: _Story, h: _Char, f: _Char) -> None:
    st.add(
        f"one night, {h.name} heard a strange noise.",
        f'it went "{st.pick("tap tap|creak|hoo hoo|scratch scratch|bump")}."',
    )
    st.add(f"{h.he} felt {st.pick('curious|nervous|scared|puzzled')}.")
    st.say(h, "who is there?")
    st.add(
        "nobody answered.",
        f"{h.he} took {_a(st.pick('lantern|flashlight|candle'))} and tiptoed outside.",
    )
    st.add(f"behind the {st.pick('shed|fence|big tree|garden wall')}, {h.he} found {f.ref}!")
    st.say(
        f,
        st.pick(
            "i am sorry. i was looking for a place to sleep.|i did not mean to scare you. i was lost."
        ),
    )
    st.say(h, "you can stay with us tonight.")
    st.add(f"{f.name} smiled, and the noise was never scary again.")


def _plot_trip(st: _Story, h: _Char, f: _Char) -> None:
    v = st.c(W.VEHICLES)
    place, prep, sights = _place(st)
    st.add(f"{st.then()}, {h.name} went to visit {h.his} {st.c(FAMILY)} by {v}.")
    st.add(f"the {v} was {st.pick('slow|crowded|noisy|old|very fast')}.")
    st.add(f"out of the window, {h.he} saw {st.c(W.NUMBERS)} {st.c(W.COUNTABLES)}.")
    _detail(st, h)
    st.add(
        f"but halfway there, the {v} stopped.",
        f"{h.name} felt {st.pick('worried|bored|nervous')}.",
    )
    st.say(h, st.pick("are we stuck?|will we ever get there?|what happened?"))
    st.add(f"{f.ref} sitting nearby shared some {st.c(W.FOODS)} and told funny stories.")
    st.add(f"soon the {v} moved again, and they arrived {prep} {place}.")
    _scene(st, h, sights)
    st.say(h, st.pick("that was a long trip, but a good one.|i made a new friend on the way!"))


def _plot_garden(st: _Story, h: _Char, f: _Char) -> None:
    flower = st.c(W.FLOWERS)
    st.add(f"in spring, {h.name} planted a row of seeds and hoped for {flower}.")
    st.add(f"{h.he} watered them every morning.", "but nothing grew.")
    st.say(h, st.pick("why are they not growing?|maybe i did something wrong."))
    st.add(f"{h.name} felt {st.pick('sad|worried|impatient|confused')}.")
    st.add(f"{f.ref} who lived next door came to look.")
    st.say(f, "plants need time. wait and see.")
    st.add(f"so {h.name} waited.", "days went by.", st.c(W.WEATHER))
    st.add(f"then one morning, {h.he} saw tiny green shoots!")
    st.add(f"soon the garden was full of {flower}, {st.c(W.COLORS)} and bright.")
    st.add(f"{h.name} gave some to {f.name}, and {f.name} felt {st.good()}.")


def _plot_wish(st: _Story, h: _Char, f: _Char) -> None:
    want = st.pick("a friend|a little dog|snow|to fly|a new bike|to see the sea|a sister")
    st.add(
        f"one night, {h.name} saw a shooting star.",
        f"{h.he} closed {h.his} eyes and wished for {want}.",
    )
    st.add(
        "the next morning, nothing had changed.",
        f"{h.name} felt {st.pick('sad|silly|disappointed')}.",
    )
    st.say(h, "maybe wishes are not real.")
    st.add(f"but later that day, {f.ref} knocked on the door.")
    st.say(f, st.pick("can i come in?|hello! i live next door now.|i need help. can you help me?"))
    _detail(st, h)
    st.add(f"they spent the whole day {st.c(W.HOBBIES)[0]}.")
    st.add(f"{h.name} smiled. sometimes a wish comes true in a way you do not expect.")


def _plot_music(st: _Story, h: _Char, f: _Char) -> None:
    inst = st.c(W.INSTRUMENTS)
    st.add(f"{h.name} was going to play the {inst} at the town show.")
    st.add(f"{h.he} practiced day and night.", f"but on the day of the show, {h.his} hands shook.")
    st.add(f"{h.he} felt {st.pick('nervous|scared|shy')}.")
    st.add(f"{f.ref} was sitting in the front row.")
    st.say(h, st.pick("what if i make a mistake?|i cannot do it!|everyone is looking at me."))
    st.say(f, st.pick("just play for me, like at home.|look at me and play. you will be fine."))
    st.add(f"{h.name} took a deep breath and began to play.")
    st.add(f"the music filled the room like {st.pick('sunshine|a warm wind|birdsong|a river')}.")
    st.add("when it ended, everyone clapped and cheered.", f"{h.name} felt {st.good()}.")


PLOTS = (
    _plot_lost,
    _plot_friend,
    _plot_explore,
    _plot_storm,
    _plot_skill,
    _plot_help,
    _plot_fear,
    _plot_share,
    _plot_event,
    _plot_build,
    _plot_quest,
    _plot_mystery,
    _plot_trip,
    _plot_garden,
    _plot_wish,
    _plot_music,
)


def _ending(st: _Story, h: _Char, f: _Char) -> None:
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


def _force_happy(st: _Story, h: _Char) -> None:
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
    st = _Story(rng, plan)
    hero = _Char(rng)
    friend = _Char(rng, avoid=hero.name)
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
