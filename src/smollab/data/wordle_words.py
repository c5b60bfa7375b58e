"""The Wordle word list: 303 five-letter words, each both a possible secret and a valid guess.

Where it comes from: the project's own story vocabulary. Every lower-case alphabetic five-letter
word found in the word banks of `smollab.data.story_words` (phrases split into words), leaving out
the banks of person and pet names (GIRL_NAMES, BOY_NAMES, PET_NAMES), filtered once and frozen
here so that prompts files and trained models stay valid when the story banks change. Nothing
is downloaded or copied from a published Wordle list. Small on purpose: a candidate set of a few
hundred keeps the information-gain reward cheap and the game learnable by a tiny model.
"""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# fmt: off
WORDS = _words(
    "about above acorn added after again alone along amber angry apple april apron asked badge "
    "baker banjo beans beech being bells bendy beret birch birds bison black boats boots bored "
    "brass brave bread bring broom brown brush build bumpy bunny cabin cakes camel canal canoe "
    "caves cawed cedar cello chalk chest chick class clear cliff cloak clock clown cocoa comes "
    "comet cream crept cried crisp crown crumb curly dress dried drops ducks dusty eager eagle "
    "early earth eight empty every faded fairy fancy feels fence ferry field finch first flood "
    "floor flute foggy fresh frogs frost froze funny fuzzy gecko geese ghost giant gifts glove "
    "gnome goose grand grass great green hands hazel heart heavy hedge hello heron hills hippo "
    "holly honey horse house human hyena ideas ivory jolly juice juicy kazoo kites koala ladle "
    "later laugh leafy learn lemon lemur light llama loose lucky lumpy lunch magic makes maple "
    "march mayor medal messy miner misty moose mossy mouse moved muddy murky music never nifty "
    "night noisy north nurse ocean often olive other otter paint panda party pears piano pilot "
    "pizza plain plate plums polar prism proud puppy queen quick quiet quilt quite raced radio "
    "rainy rhino river robin robot rocky roofs roses rough round ruler rusty salty sandy scarf "
    "seven shady shape share sheep shelf shell shiny ships shirt shone shook shore short shrew "
    "silky silly skunk sleek sleep sloth small smart smoke snail snake snowy socks soggy solid "
    "songs sorry spicy spiky spool spoon stack stamp stars steep steps stick still stone stork "
    "storm sunny swamp sweep sweet table tacos tarts taste teddy there thick three tiger timid "
    "tired toast tools tooth towel tower train trees troll truck truth tunic twice under upset "
    "wagon water waved waves whale wheel where while white whole windy witch woods world worth "
    "would young zebra"
)
# fmt: on
