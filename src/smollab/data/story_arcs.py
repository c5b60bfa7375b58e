"""The sixteen plot types of the story generator (problem or event, dialogue, resolution).

Kept apart from the openings and endings because they are most of the generator's text; `stories`
draws one from `PLOTS` per story, so the order of that table is part of the seeded output.
"""

from __future__ import annotations

from smollab.data import story_words as W
from smollab.data.story_kit import (
    FAMILY,
    Char,
    Story,
    article,
    detail,
    scene,
    some_object,
    some_place,
)


def _plot_lost(st: Story, h: Char, f: Char) -> None:
    obj = some_object(st).split()[-1] if st.p(0.3) else some_object(st)
    place, prep, sights = some_place(st)
    st.add(f"{st.then()}, {h.name} took {h.his} {obj} to {place}.")
    scene(st, h, sights)
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


def _plot_friend(st: Story, h: Char, f: Char) -> None:
    place, prep, sights = some_place(st)
    st.add(f"but {h.name} had no one to play with, and {h.he} felt {st.pick('lonely|sad|bored')}.")
    st.add(f"{st.then()}, {h.he} went to {place}.")
    scene(st, h, sights)
    st.add(f"there {h.he} met {f.ref}, who was sitting all alone.")
    st.say(h, "hello! what is your name?")
    st.say(f, f"i am {f.name}. i am new here.")
    st.say(h, f"do you want to {st.c(W.HOBBIES)[2]} with me?")
    st.add(f"{f.name} smiled and nodded.")
    st.add(f"they {st.c(W.HOBBIES)[1]} and {st.c(W.HOBBIES)[1]} all afternoon.")
    if st.p(0.5):
        st.add(f"when it was time to go home, {h.name} felt {st.good()}.")
    st.say(f, st.pick("can we play again tomorrow?|you are my first friend here.|this was fun!"))


def _plot_explore(st: Story, h: Char, f: Char) -> None:
    place, prep, sights = some_place(st)
    st.add(f"{st.then()}, {h.name} decided to explore {place}.")
    scene(st, h, sights)
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


def _plot_storm(st: Story, h: Char, f: Char) -> None:
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


def _plot_skill(st: Story, h: Char, f: Char) -> None:
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


def _plot_help(st: Story, h: Char, f: Char) -> None:
    need, state, fix = st.c(W.HELP_NEEDS)
    place, prep, sights = some_place(st)
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


def _plot_fear(st: Story, h: Char, f: Char) -> None:
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


def _plot_share(st: Story, h: Char, f: Char) -> None:
    obj = some_object(st)
    st.add(f"one day, {h.name} and {f.ref} found {article(obj)} in the yard.")
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


def _plot_event(st: Story, h: Char, f: Char) -> None:
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


def _plot_build(st: Story, h: Char, f: Char) -> None:
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


def _plot_quest(st: Story, h: Char, f: Char) -> None:
    goal = st.pick(
        "the top of the tall hill|the end of the rainbow|the oldest tree in the forest|the lost lake|the other side of the river"
    )
    st.add(f"{h.name} wanted to find {goal}.")
    st.add(f"{h.he} packed {st.c(W.FOODS)} and {article(st.c(W.OBJECTS))}, and set off.")
    for _ in range(st.rng.randrange(1, 3)):
        place, prep, sights = some_place(st)
        st.add(f"first {h.he} walked to {place}, past {st.c(sights)}.")
    st.add(f"the path was long, and {h.name} felt {st.pick('tired|hungry|lost|worried')}.")
    st.add(f"then {h.he} met {f.ref}.")
    st.say(f, "i know the way. follow me!")
    st.add(f"together they walked and walked until they reached {goal}.")
    st.add(f"it was more beautiful than {h.name} had ever imagined.", f"{h.he} felt {st.good()}.")


def _plot_mystery(st: Story, h: Char, f: Char) -> None:
    st.add(
        f"one night, {h.name} heard a strange noise.",
        f'it went "{st.pick("tap tap|creak|hoo hoo|scratch scratch|bump")}."',
    )
    st.add(f"{h.he} felt {st.pick('curious|nervous|scared|puzzled')}.")
    st.say(h, "who is there?")
    st.add(
        "nobody answered.",
        f"{h.he} took {article(st.pick('lantern|flashlight|candle'))} and tiptoed outside.",
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


def _plot_trip(st: Story, h: Char, f: Char) -> None:
    v = st.c(W.VEHICLES)
    place, prep, sights = some_place(st)
    st.add(f"{st.then()}, {h.name} went to visit {h.his} {st.c(FAMILY)} by {v}.")
    st.add(f"the {v} was {st.pick('slow|crowded|noisy|old|very fast')}.")
    st.add(f"out of the window, {h.he} saw {st.c(W.NUMBERS)} {st.c(W.COUNTABLES)}.")
    detail(st, h)
    st.add(
        f"but halfway there, the {v} stopped.",
        f"{h.name} felt {st.pick('worried|bored|nervous')}.",
    )
    st.say(h, st.pick("are we stuck?|will we ever get there?|what happened?"))
    st.add(f"{f.ref} sitting nearby shared some {st.c(W.FOODS)} and told funny stories.")
    st.add(f"soon the {v} moved again, and they arrived {prep} {place}.")
    scene(st, h, sights)
    st.say(h, st.pick("that was a long trip, but a good one.|i made a new friend on the way!"))


def _plot_garden(st: Story, h: Char, f: Char) -> None:
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


def _plot_wish(st: Story, h: Char, f: Char) -> None:
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
    detail(st, h)
    st.add(f"they spent the whole day {st.c(W.HOBBIES)[0]}.")
    st.add(f"{h.name} smiled. sometimes a wish comes true in a way you do not expect.")


def _plot_music(st: Story, h: Char, f: Char) -> None:
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
