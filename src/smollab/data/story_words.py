"""Word banks for the offline story generator (`smollab.data.stories`).

Everything is lower-case. No entry may contain the substring "happy": the generator alone decides
which stories mention it, so that its rate is controlled (a GRPO reward counts it).
"""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# fmt: off
GIRL_NAMES = _words(
    "mia lily emma ava sophie zoe lucy ella grace chloe ruby anna maya nora lena sara hana rosa "
    "ivy luna amara nia aisha priya mei yuki sofia elena clara julia olivia hazel violet daisy "
    "poppy stella iris alice molly ellie kate jane tara leah naomi fatima layla zara kira nina "
    "eva isla freya maria lola bella greta tess june wren fern mira asha keiko lina sana noor ada "
    "bea cora dora edie faye gina hope jade kim liv mae nell opal pearl rae skye tia uma vera "
    "willa yara zuri amy beth gemma holly lottie matilda penny rita susie tilly abby carmen "
    "diana esther flora gloria helen ingrid josie katie lucia mabel nadia olga paula rosie "
    "selma tina ursula wanda agnes bonnie celia delia eloise frida georgia harriet imani "
    "jasmine kiki lucille marnie nova odette petra queenie rhea sienna thea una valerie winnie "
    "yasmin zelda"
)

BOY_NAMES = _words(
    "leo max sam ben tom jack finn noah liam owen eli jake luke alex theo oscar hugo felix milo "
    "ollie kai ravi omar ali yusuf hiro kenji chen raj arjun dev mateo diego carlos luis pablo "
    "marco ivan nils lars erik jonas tim dan ned ted bob joe will henry george arthur louis jamie "
    "toby charlie harry rory sid zack ezra jude kofi tariq amir malik femi obi jin taro sven otto "
    "emil pete rob gus hank jay kit lou nate pip roy seth wes zane adam billy colin eddie frank "
    "hassan isaac jasper kevin marty nico paul ron victor aaron bruno cody dylan elliot "
    "fred gabriel harvey igor jonah kyle leon miles neil omari percy quentin rafael simon "
    "tobias umar vince walter ahmed barney casper dexter emmett fergus gideon horace ibrahim "
    "joel kasper leroy monty norman orson quincy reuben stanley teddy ulysses wilbur xavier "
    "yosef zeke"
)

PET_NAMES = _words(
    "biscuit pepper patch coco bubbles button rusty sunny mango peanut noodle pickle maple ziggy "
    "bramble clover pebble whiskers socks shadow tumble fizz bolt sprout nutmeg toffee waffle "
    "dot pudding blue ginger honey moss puddle sparky jellybean nugget pumpkin cinnamon "
    "marshmallow snowball thistle juniper dash flash rascal comet pip squeak"
)

ANIMALS = _words(
    "fox rabbit bunny bear owl mouse cat kitten dog puppy duck duckling frog turtle squirrel deer "
    "hedgehog badger wolf lion tiger elephant giraffe monkey panda penguin seal whale dolphin "
    "crab bee butterfly ladybug snail robin sparrow crow parrot goose hen pig cow goat sheep "
    "horse pony donkey lamb zebra hippo koala otter beaver raccoon mole bat snake lizard "
    "hamster llama chick beetle firefly swan camel kangaroo octopus walrus moose "
    "skunk chipmunk ferret peacock flamingo pelican eagle hawk stork toucan gorilla cheetah "
    "leopard rhino buffalo bison ostrich seahorse starfish jellyfish tadpole caterpillar "
    "grasshopper cricket dragonfly puffin gecko iguana armadillo sloth lemur weasel "
    "hare vole shrew newt toad salamander heron kingfisher woodpecker magpie pigeon dove "
    "canary finch lobster shrimp clam oyster panther jaguar hyena antelope yak reindeer "
    "porcupine possum mongoose meerkat tortoise platypus"
) + ("polar bear",)

BEINGS = _words(
    "robot fairy giant wizard dragon unicorn dinosaur princess prince king queen knight pirate "
    "baker farmer sailor gardener troll elf ghost snowman scarecrow astronaut mermaid witch "
    "painter teacher doctor fisherman nurse pilot firefighter chef clown magician inventor "
    "explorer shepherd miner librarian carpenter tailor potter beekeeper zookeeper singer "
    "dancer goblin gnome mermaid"
)

IT_BEINGS = {"robot", "snowman", "scarecrow", "ghost"}
SHE_BEINGS = {"fairy", "princess", "queen", "mermaid", "witch"}
HE_BEINGS = {"wizard", "prince", "king", "knight", "giant", "troll", "fisherman"}

PERSON_ADJ = _words(
    "little small young brave shy clever kind curious silly gentle busy sleepy grumpy friendly "
    "quiet loud cheerful tall smart sweet clumsy lively calm thoughtful polite cheeky daring "
    "tidy dreamy eager honest jolly timid bold careful messy noisy funny playful"
)

CHAR_ADJ = _words(
    "little small tiny big old young brave shy clever kind curious silly gentle busy sleepy "
    "grumpy friendly quiet loud fast slow fluffy playful wise funny lonely bold careful messy "
    "noisy cheerful tall short smart sweet proud clumsy lively calm fuzzy spotted striped "
    "speedy bouncy dreamy thoughtful polite cheeky daring tidy sneaky chubby skinny wobbly "
    "sparkly cuddly eager humble honest lazy jolly timid nimble"
)

# what a character is like (predicates after "was")
TRAITS = (
    "very kind", "a little shy", "always curious", "very brave", "quite clever", "a bit silly",
    "very gentle", "always busy", "often sleepy", "a little grumpy", "very friendly", "very quiet",
    "very careful", "a little clumsy", "full of ideas", "always kind to others", "quick and clever",
    "small but strong", "slow but patient", "curious about everything", "a good listener",
    "the fastest runner in town", "a great helper", "never afraid of the rain",
    "always humming a tune", "very good at puzzles", "the tallest in the class",
    "a little forgetful", "very polite", "always hungry", "full of questions", "very neat",
    "quick to laugh", "good at keeping secrets",
)

# (gerund phrase, past phrase, base phrase)
HOBBIES = (
    ("painting pictures", "painted pictures", "paint pictures"),
    ("reading books", "read books", "read books"),
    ("singing songs", "sang songs", "sing songs"),
    ("playing with a ball", "played with a ball", "play with a ball"),
    ("building towers of blocks", "built towers of blocks", "build towers of blocks"),
    ("climbing trees", "climbed trees", "climb trees"),
    ("dancing in the rain", "danced in the rain", "dance in the rain"),
    ("looking at the stars", "looked at the stars", "look at the stars"),
    ("baking cookies", "baked cookies", "bake cookies"),
    ("flying a kite", "flew a kite", "fly a kite"),
    ("collecting shells", "collected shells", "collect shells"),
    ("picking flowers", "picked flowers", "pick flowers"),
    ("drawing animals", "drew animals", "draw animals"),
    ("playing the drum", "played the drum", "play the drum"),
    ("riding a bike", "rode a bike", "ride a bike"),
    ("swimming in the lake", "swam in the lake", "swim in the lake"),
    ("telling jokes", "told jokes", "tell jokes"),
    ("planting seeds", "planted seeds", "plant seeds"),
    ("counting clouds", "counted clouds", "count clouds"),
    ("making music", "made music", "make music"),
    ("jumping in puddles", "jumped in puddles", "jump in puddles"),
    ("running in the park", "ran in the park", "run in the park"),
    ("fixing old toys", "fixed old toys", "fix old toys"),
    ("writing stories", "wrote stories", "write stories"),
    ("watching the birds", "watched the birds", "watch the birds"),
    ("playing hide and seek", "played hide and seek", "play hide and seek"),
    ("making paper boats", "made paper boats", "make paper boats"),
    ("catching leaves", "caught leaves", "catch leaves"),
    ("exploring the woods", "explored the woods", "explore the woods"),
    ("digging in the sand", "dug in the sand", "dig in the sand"),
    ("skipping stones", "skipped stones", "skip stones"),
    ("whistling tunes", "whistled tunes", "whistle tunes"),
    ("solving puzzles", "solved puzzles", "solve puzzles"),
    ("knitting scarves", "knitted scarves", "knit scarves"),
    ("playing the flute", "played the flute", "play the flute"),
    ("chasing butterflies", "chased butterflies", "chase butterflies"),
    ("making sandcastles", "made sandcastles", "make sandcastles"),
    ("feeding the ducks", "fed the ducks", "feed the ducks"),
    ("building snowmen", "built snowmen", "build snowmen"),
    ("sewing dolls", "sewed dolls", "sew dolls"),
    ("juggling apples", "juggled apples", "juggle apples"),
    ("playing chess", "played chess", "play chess"),
    ("rowing a boat", "rowed a boat", "row a boat"),
    ("blowing bubbles", "blew bubbles", "blow bubbles"),
    ("carving wood", "carved wood", "carve wood"),
    ("sliding down hills", "slid down hills", "slide down hills"),
    ("listening to the radio", "listened to the radio", "listen to the radio"),
    ("making necklaces", "made necklaces", "make necklaces"),
    ("pressing flowers", "pressed flowers", "press flowers"),
    ("helping in the garden", "helped in the garden", "help in the garden"),
)

HOMES_PERSON = (
    "in a small house by the sea", "in a little cottage at the edge of the woods",
    "in a tall blue house on a hill", "on a farm near the river", "in a busy city",
    "in a quiet village", "in a yellow house with a red door", "above a bakery",
    "in a house with a big garden", "near an old lighthouse", "in a cabin in the mountains",
    "in a flat at the top of a tall building", "in a sleepy town by a lake",
)
HOMES_ANIMAL = (
    "in a cozy den under an old oak tree", "in a burrow under the meadow", "in a nest high in a tree",
    "by a pond full of lily pads", "in a hollow log", "deep in the green forest",
    "near a bubbling stream", "in a barn on a farm", "at the edge of a big field",
    "in a cave behind a waterfall", "under a bush in the park", "in the tall grass by the river",
)
HOMES_BEING = (
    "in a castle on a hill", "in a tall tower", "in a workshop full of tools",
    "in a garden full of flowers", "in a small town", "on a ship at sea", "in a land far away",
    "in a little shop on main street", "in a magic forest", "on the top of a snowy mountain",
)

# name -> (preposition, sights there)
PLACES = {
    "the forest": ("in", ("tall trees", "soft green moss", "a quiet stream", "mushrooms under the ferns", "birds in the branches")),
    "the park": ("in", ("a big slide", "swings", "a duck pond", "green benches", "children playing")),
    "the beach": ("on", ("golden sand", "pretty shells", "big waves", "crabs near the rocks", "a red boat")),
    "the garden": ("in", ("rows of carrots", "bright flowers", "a little fountain", "busy bees", "a tall sunflower")),
    "the meadow": ("in", ("tall grass", "wild flowers", "hopping grasshoppers", "a lonely tree", "butterflies")),
    "the market": ("at", ("stalls of fruit", "fresh bread", "colorful hats", "people talking", "a man selling balloons")),
    "the library": ("at", ("shelves of books", "a sleepy cat", "big windows", "a quiet corner", "a kind librarian")),
    "the farm": ("on", ("red barns", "muddy pigs", "a tractor", "fields of corn", "hens in the yard")),
    "the lake": ("by", ("clear water", "a wooden dock", "swans", "tall reeds", "small fish")),
    "the mountain": ("on", ("big rocks", "cold wind", "snow at the top", "a winding path", "goats")),
    "the river": ("by", ("smooth stones", "a little bridge", "frogs", "rushing water", "a fallen log")),
    "the school": ("at", ("a noisy playground", "desks in rows", "a big blackboard", "a bell", "paintings on the wall")),
    "the zoo": ("at", ("lions sleeping", "tall giraffes", "a penguin pool", "a long line for ice cream", "monkeys swinging")),
    "the town square": ("in", ("a fountain", "a big clock", "pigeons", "a music band", "a flower shop")),
    "the bakery": ("at", ("warm bread", "sweet cakes", "a smiling baker", "flour everywhere", "a bell on the door")),
    "the castle": ("at", ("high walls", "a long hall", "flags on the towers", "a deep moat", "old paintings")),
    "the cave": ("in", ("dark corners", "dripping water", "shiny rocks", "sleeping bats", "echoes")),
    "the island": ("on", ("palm trees", "white sand", "a hidden cove", "coconuts", "colorful birds")),
    "the orchard": ("in", ("apple trees", "ripe pears", "a wooden ladder", "baskets of fruit", "buzzing bees")),
    "the hill": ("on", ("a lone tree", "a view of the town", "soft grass", "windy air", "a stone bench")),
    "the pond": ("by", ("lily pads", "green frogs", "ducks", "dragonflies", "cattails")),
    "the city": ("in", ("tall buildings", "busy streets", "yellow taxis", "bright lights", "a big park")),
    "the playground": ("at", ("a sandbox", "monkey bars", "a seesaw", "a merry go round", "a tall slide")),
    "the harbor": ("at", ("fishing boats", "seagulls", "ropes and nets", "a lighthouse", "salty air")),
    "the attic": ("in", ("dusty boxes", "an old trunk", "a round window", "cobwebs", "forgotten toys")),
    "the kitchen": ("in", ("a warm oven", "pots and pans", "a bowl of fruit", "a ticking clock", "a wooden table")),
    "the desert": ("in", ("hot sand", "tall cactus plants", "a tiny oasis", "lizards", "dunes")),
    "the jungle": ("in", ("thick vines", "giant leaves", "noisy parrots", "a hidden river", "monkeys")),
    "the museum": ("at", ("old bones", "shiny statues", "a big map", "quiet halls", "a dinosaur skeleton")),
    "the train station": ("at", ("a long train", "a ticket booth", "a big clock", "people with bags", "a whistle")),
    "the toy shop": ("at", ("wind up mice", "rocking horses", "shelves of puzzles", "a puppet show", "a jar of marbles")),
    "the old mill": ("at", ("a creaking wheel", "sacks of flour", "a sleepy miller", "a mossy wall", "a rushing stream")),
    "the lighthouse": ("at", ("a spiral staircase", "a great lamp", "crashing waves", "gulls", "a view of the ships")),
    "the circus": ("at", ("a striped tent", "jugglers", "acrobats on ropes", "a juggling seal", "a drum roll")),
    "the ice rink": ("at", ("shiny ice", "skaters spinning", "warm cocoa", "frosty windows", "bright scarves")),
    "the valley": ("in", ("a winding river", "grazing horses", "purple heather", "stone walls", "a tiny chapel")),
    "the bookshop": ("at", ("dusty books", "a ladder on wheels", "a reading chair", "maps of faraway lands", "a ginger cat")),
    "the greenhouse": ("in", ("tomato vines", "warm damp air", "orchids", "clay pots", "a watering can")),
    "the fairground": ("at", ("a ferris wheel", "candy floss", "bumper cars", "flashing lights", "a carousel")),
    "the woods": ("in", ("crunchy leaves", "a fallen oak", "a fox den", "tangled brambles", "a babbling brook")),
    "the barn": ("in", ("bales of hay", "a sleepy horse", "swallows in the rafters", "a rusty plough", "kittens")),
    "the pier": ("on", ("fishing lines", "wooden planks", "seals on the rocks", "ice cream carts", "sailboats")),
    "the aquarium": ("at", ("glass tanks", "a giant octopus", "glowing jellyfish", "a shark tunnel", "sea turtles")),
    "the snowy field": ("in", ("deep snow", "sled tracks", "a frozen pond", "snowmen", "icicles on the fence")),
}

OBJECTS = _words(
    "ball kite book hat scarf shell stone key map box drum bell lamp cup boat bike wagon doll "
    "blanket jar basket feather leaf acorn pencil crayon paintbrush balloon coin ring necklace "
    "shoe boot sock glove umbrella bucket shovel rope ladder clock mirror candle teapot whistle "
    "marble button ribbon flag flute trumpet puzzle sled lantern compass backpack notebook "
    "seed pumpkin crown wand bracelet brush comb pillow quilt spoon fork plate bowl jug "
    "tent flashlight magnet telescope camera radio guitar violin piano harp yoyo frisbee "
    "skateboard scooter helmet sweater mitten apron vase pot kettle broom sponge towel "
    "envelope letter postcard sticker stamp medal trophy tambourine pinwheel"
) + ("toy train", "toy car", "teddy bear", "music box", "picture book", "jump rope")

COLORS = _words(
    "red blue green yellow orange purple pink white black brown gray golden silver shiny "
    "striped spotted"
)

OBJ_ADJ = _words(
    "old new tiny big soft round shiny special favorite little heavy light magic lucky broken "
    "small bright warm"
)

FOODS = _words(  # plural, countable: "the {food} were gone"
    "apples cookies berries carrots pancakes muffins nuts sandwiches oranges grapes noodles "
    "plums pears strawberries blueberries cherries peaches bananas potatoes peas beans "
    "tomatoes cucumbers melons walnuts waffles biscuits dumplings tacos cupcakes donuts "
    "pretzels buns cakes pies tarts"
)
MEALS = (
    "honey", "soup", "cheese", "bread", "rice", "pizza", "porridge", "popcorn", "jam on toast",
    "corn", "fish", "spaghetti", "carrot cake", "apple pie", "ice cream", "pumpkin soup",
)

SMELLS = (
    "fresh bread", "rain", "pine trees", "flowers", "salt", "warm cookies", "wet grass", "smoke",
    "oranges", "cut grass", "the sea", "hot soup", "wild roses",
    "cinnamon", "mint", "hay", "lemons", "wet earth", "chocolate", "pancakes", "lilacs",
)
SOUNDS = (
    "birds singing", "the waves", "the wind in the trees", "frogs croaking", "bells ringing",
    "children laughing", "rain on the roof", "a dog barking", "leaves rustling", "a train far away",
    "owls hooting", "bees buzzing", "water splashing", "a soft song",
    "a woodpecker tapping", "sheep bleating", "a kettle whistling", "church bells", "crickets chirping",
    "thunder rolling", "a cow mooing", "footsteps in the hall", "wind chimes", "a clock ticking",
)

TIMES = (
    "one morning", "one sunny day", "one rainy afternoon", "one cold winter night",
    "on a windy day", "early one morning", "late one evening", "one summer day",
    "one autumn morning", "on the first day of spring", "one snowy day", "one bright morning",
    "one warm evening", "one saturday", "after school one day", "one foggy morning",
    "on a quiet sunday", "one stormy night", "at dawn", "one cloudy day",
)

WEATHER = (
    "the sun was bright and warm.", "the sky was gray, and a cold wind blew.",
    "it was raining softly.", "snow covered the ground like a white blanket.",
    "fog rolled over the hills.", "big clouds were moving across the sky.",
    "the air was cool and fresh.", "it was very hot, and the ground was dry.",
    "a gentle breeze moved the leaves.", "the wind howled outside.",
    "the stars were shining in the dark sky.", "the morning was quiet and still.",
    "little drops of rain fell on the window.", "the leaves were red and orange.",
    "it was the first warm day of the year.", "thunder rumbled far away.",
    "the puddles shone like mirrors.", "a rainbow hung over the hills.", "frost sparkled on the grass.",
    "the clouds were pink and gold.", "the wind was warm and smelled of summer.",
    "hail bounced on the roof.", "a thick mist hid the trees.", "the moon was full and round.",
    "the sky was clear and blue.", "icicles hung from the roof.",
)

# feelings; "happy" is deliberately absent
GOOD_FEELINGS = (
    "glad", "proud", "calm", "excited", "grateful", "cheerful", "joyful", "thankful", "relieved",
    "peaceful", "delighted", "safe", "warm inside", "hopeful", "brave", "full of joy", "content",
)
BAD_FEELINGS = (
    "sad", "scared", "angry", "tired", "lonely", "nervous", "worried", "upset", "afraid",
    "frightened", "confused", "grumpy", "jealous", "bored", "shy", "hungry", "cold", "frustrated",
)
MID_FEELINGS = ("curious", "surprised", "excited", "amazed", "puzzled", "eager", "thoughtful")

SAY = (
    "said", "said", "said", "asked", "shouted", "whispered", "called", "cried", "replied",
    "answered", "laughed", "added", "yelled", "sighed",
)

CONNECT = (
    "then", "after a while", "soon", "suddenly", "later", "the next day", "just then",
    "a moment later", "before long", "that afternoon", "after lunch", "at first",
)

LESSONS = (
    "it is good to share", "friends help each other", "trying again is how we learn",
    "kindness always comes back", "a problem is smaller when you are not alone",
    "being patient is important", "it is okay to ask for help", "it is fine to make mistakes",
    "small things can make a big difference", "listening is a kind of magic",
    "slow and steady can win", "being brave does not mean you are not scared",
    "a true friend is worth more than gold", "home is where the people you love are",
    "everyone is good at something", "telling the truth is always best",
    "working together makes hard things easy", "there is beauty in every day",
    "the best gifts come from the heart", "it is good to be curious", "you should never give up",
    "a kind word can change a whole day", "sharing a meal makes it taste better",
    "everyone feels scared sometimes", "it is important to say sorry",
)

# things that can be lost or found and their usual hiding spots
HIDING_SPOTS = (
    "under the bed", "behind the sofa", "in the tall grass", "under a pile of leaves",
    "inside an old boot", "on a high shelf", "in the toy box", "under a big rock",
    "behind the door", "in the garden", "next to the pond", "in a bird's nest",
    "under the table", "in a coat pocket", "behind a tree",
)

TREASURES = (
    "a shiny stone", "a golden key", "an old map", "a tiny door in a tree", "a glowing shell",
    "a box full of buttons", "a secret garden", "a little lost bird", "a silver bell",
    "a book with a strange picture", "a nest with three blue eggs", "a path of white pebbles",
    "a ring of mushrooms", "a sleeping kitten", "a bottle with a note inside",
    "a wooden chest", "a feather as long as an arm", "a rainbow colored rock",
    "a lost glove with a name inside", "an old clock that still ticked", "a cave full of crystals",
    "a tiny boat made of bark", "a footprint as big as a table", "a letter from long ago",
    "a nest of baby rabbits", "a fairy ring in the grass", "a door with no handle", "a silver fish in a jar",
)

SKILLS = (
    ("ride a bike", "rode the bike", "fell off the bike"),
    ("swim", "swam across the pool", "sank and coughed up water"),
    ("whistle", "whistled a clear note", "only made a puffing sound"),
    ("tie shoes", "tied the laces", "made a big knot"),
    ("fly", "flew over the trees", "fell into a bush"),
    ("skate", "skated around the pond", "slipped on the ice"),
    ("bake bread", "baked a perfect loaf", "burned the bread"),
    ("read", "read the whole page", "mixed up the letters"),
    ("juggle", "juggled three balls", "dropped every ball"),
    ("play the violin", "played a sweet song", "made a squeaky noise"),
    ("climb the big tree", "climbed to the top", "slid back down"),
    ("jump rope", "jumped twenty times", "tripped over the rope"),
    ("catch a fish", "caught a shiny fish", "caught an old boot"),
    ("paint a sunset", "painted a bright sunset", "spilled the paint"),
)

HELP_NEEDS = (  # (who, their trouble, what the hero did)
    ("a bird with a hurt wing", "the bird could not fly", "made a soft bed of leaves for it"),
    ("a kitten stuck in a tree", "the kitten was crying on a high branch", "climbed up and carried it down"),
    ("a puppy lost in the rain", "the puppy was shaking with cold", "wrapped it in a warm scarf"),
    ("an old turtle on its back", "the turtle could not turn over", "gently turned it over"),
    ("a baby duck far from its mother", "the duck was calling for help", "led it back to the pond"),
    ("a little boy who dropped his apples", "the apples rolled everywhere", "helped gather every apple"),
    ("an old woman with heavy bags", "she was tired and slow", "carried the bags home for her"),
    ("a bee stuck in a spider web", "the bee was buzzing loudly", "pulled it free with a twig"),
    ("a fish in a small puddle", "the fish was flopping on the mud", "carried it back to the river"),
    ("a snowman losing its hat", "the snowman looked cold", "found a new hat for it"),
    ("a lamb caught in a fence", "the lamb could not get out", "pulled the wire apart slowly"),
    ("a lost little girl", "she could not find her mother", "walked with her until they found her mother"),
)

FEARS = (
    ("the dark", "the shadows moved on the wall", "it was only the curtain in the wind"),
    ("thunder", "a loud boom shook the windows", "thunder is just the sound of the sky"),
    ("the big dog next door", "the dog barked loudly", "the dog only wanted to play"),
    ("deep water", "the water looked very deep", "with a float, the water was fun"),
    ("the old house on the hill", "the door creaked open", "an old cat lived there, nothing more"),
    ("spiders", "a spider climbed down a thread", "the spider was small and busy"),
    ("high places", "the ground looked far away", "holding on tight made it easy"),
    ("the first day of school", "so many new faces were there", "the other children were kind"),
)

EVENTS = (
    "a birthday party", "the summer fair", "a picnic by the lake", "the big race",
    "a music show", "the harvest festival", "a snow day", "a trip to the sea",
    "a sleepover", "a costume party", "the spring parade", "a camping trip",
)

BUILDS = (
    ("a sandcastle", "a big wave washed it away"), ("a treehouse", "the roof fell down"),
    ("a snowman", "the sun melted its head"), ("a tower of blocks", "it fell with a crash"),
    ("a boat from sticks", "it sank in the pond"), ("a kite from paper", "the wind tore it"),
    ("a bird house", "the door came off"), ("a fort of blankets", "it fell flat"),
    ("a cart with four wheels", "one wheel rolled away"), ("a pie for the fair", "it burned in the oven"),
)
CLOTHES = (
    "hat", "scarf", "coat", "raincoat", "sweater", "dress", "cap", "jacket", "pair of boots",
    "pair of mittens", "cape", "apron", "vest", "bow tie", "belt", "pair of sandals", "hood",
    "pair of socks", "shirt with stars on it", "pair of glasses", "backpack", "necklace",
    "beret", "bonnet", "cloak", "poncho", "pair of overalls", "kilt", "pair of pyjamas",
    "tunic", "waistcoat", "pair of slippers", "pair of wellies", "sun hat", "headband",
    "bandana", "cardigan", "tracksuit", "pair of earmuffs", "pair of dungarees",
)
FLOWERS = (
    "roses", "tulips", "daisies", "sunflowers", "lilies", "violets", "poppies", "bluebells",
    "daffodils", "buttercups", "lavender", "marigolds", "dandelions", "orchids", "pansies",
    "peonies", "irises", "crocuses", "snowdrops", "primroses", "foxgloves", "hyacinths",
    "carnations", "lupins", "cornflowers", "honeysuckle", "jasmine", "clover", "heather",
)
TREES = (
    "oak", "pine", "willow", "maple", "birch", "apple", "cherry", "palm", "elm", "cedar", "ash",
    "beech", "chestnut", "spruce", "fir", "poplar", "sycamore", "magnolia", "lemon", "olive",
    "walnut", "holly", "hazel", "redwood", "baobab", "plum", "pear", "fig", "juniper", "yew",
)
# (an animal does something nearby)
CRITTER_ACTS = (
    "a squirrel ran up a tree", "a frog jumped into the water", "a bird sang on a branch",
    "a rabbit hopped across the path", "a bee buzzed from flower to flower",
    "a butterfly landed on a leaf", "an owl blinked from its hole", "a cat stretched in the sun",
    "a dog wagged its tail", "ducks paddled in a row", "a snail crept along a wall",
    "a deer watched from the trees", "a mouse nibbled a seed", "a crow cawed loudly",
    "ants marched in a long line", "a fish splashed in the stream", "a goat chewed some grass",
    "a hedgehog curled into a ball", "two sparrows argued over a crumb", "a lamb bleated",
)
MOTIONS = (
    "hopped", "skipped", "marched", "tiptoed", "wandered", "raced", "strolled", "crawled",
    "climbed", "slid", "splashed", "danced", "zoomed", "waddled", "trotted", "dashed",
    "stomped", "rolled", "jogged", "ran", "walked", "sneaked", "bounced", "paddled",
)
PATHS = (
    "over the bridge", "along the river", "through the tall grass", "across the field",
    "down the hill", "up the stairs", "around the corner", "past the old mill",
    "under the fence", "between the trees", "along the sandy shore", "through the gate",
    "over the stepping stones", "past the sleepy cows", "down the muddy lane",
    "around the pond", "through the busy market", "up the winding path", "across the street",
)
DRINKS = ("milk", "water", "lemonade", "hot cocoa", "tea", "apple juice", "orange juice")
NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve", "twenty")
COUNTABLES = (
    "clouds", "ducks", "stars", "pebbles", "apples", "boats", "birds", "buttons", "leaves",
    "shells", "steps", "sheep", "windows", "trees", "flowers", "cookies", "lanterns",
    "kites", "chimneys", "puddles", "fireflies", "rooftops", "carriages", "tractors",
    "sailboats", "scarecrows", "haystacks", "cottages", "bicycles", "umbrellas", "geese",
)
THOUGHTS = (
    "the stars", "what to eat for dinner", "how big the sea was", "where the wind came from",
    "a song from long ago", "the best way to build a boat", "what the birds were saying",
    "the colors of the sky", "why the moon changes shape", "the next big adventure",
    "faraway places", "dragons and castles", "how many fish live in the sea",
    "what makes thunder so loud", "where rainbows go at night", "how bees make honey",
    "what lies under the ice", "whether fish ever sleep", "the shape of the earth",
    "how old the mountains were", "who invented the wheel", "why leaves turn orange",
    "what the future would bring", "the tallest tower in the world", "the secrets of the tide",
)
VEHICLES = (
    "bus", "train", "boat", "cart", "bicycle", "truck", "wagon", "sled", "ship", "balloon",
    "tram", "ferry", "canoe", "raft", "tractor", "carriage", "scooter", "motorbike", "taxi",
    "submarine", "helicopter", "airship", "rowboat", "caravan", "van",
)
INSTRUMENTS = (
    "drum", "flute", "piano", "violin", "guitar", "trumpet", "harp", "horn", "cello",
    "clarinet", "trombone", "banjo", "ukulele", "xylophone", "accordion", "tuba", "oboe",
    "bagpipe", "tambourine", "saxophone", "recorder", "mandolin", "harmonica", "triangle",
)
SHAPES = (
    "a heart", "a star", "a circle", "a boat", "a rabbit", "a dragon", "a castle", "a moon",
    "a teapot", "an elephant", "a giant sock", "a sleeping cat", "a crown", "a whale",
    "a bowl of noodles", "a running horse", "a wizard's hat", "a snail", "a kettle", "a comb",
)
ADJECTIVES = _words(
    "enormous tiny crooked sparkling dusty velvety smooth rough bumpy fuzzy prickly slippery "
    "sticky squishy crunchy juicy glowing faded ancient mysterious gigantic wooden woolly silky "
    "shimmering twinkling creaky rusty polished muddy frosty icy shady misty gloomy cozy chilly "
    "spicy sour salty fresh golden emerald crimson amber ivory turquoise scarlet pale dark deep "
    "shallow narrow wide steep flat hollow heavy feathery delicate fragile sturdy hidden secret "
    "forgotten magical strange peculiar odd wonderful marvelous splendid lovely plain fancy neat "
    "wrinkled patched dotted checkered round square pointy curly twisty tangled dim silent "
    "fierce wild empty loose damp soggy crisp cracked chipped bent dull huge miniature thick "
    "thin speckled glittering lumpy knobbly spiky swirly glassy freckled rosy sleek shaggy "
    "tattered glossy murky gleaming sandy rocky grassy leafy snowy stormy foggy breezy "
    "enchanted lopsided chunky dainty jagged rumpled sturdy shabby spotless grand humble "
    "tremendous elegant nifty quaint mossy powdery frozen scorching lukewarm brittle flimsy "
    "bendy stretchy fluffy prickly velvet marble copper bronze iron brass crystal"
)
SMALL_THINGS = _words(
    "pebble twig pinecone seashell feather acorn button marble key coin ribbon leaf bead "
    "crystal spoon bottle jar bell thimble walnut chestnut stick cork spool whistle medal "
    "badge locket tooth bone egg fossil gem nut seed thread needle candle stub paperclip "
    "teacup saucer ladle thimble buckle brooch pin toothbrush comb harmonica kazoo "
    "domino dice chalk eraser ruler magnifier lens prism horseshoe lid"
)
HANDLE_VERBS = (
    "polished", "cleaned", "wrapped up", "carried", "held up", "shook", "tossed", "sniffed",
    "studied", "decorated", "painted", "hid", "buried", "traded", "lifted", "turned over",
    "examined", "weighed", "rubbed", "washed", "dried", "showed everyone", "drew a picture of",
    "tucked away", "balanced", "spun", "tapped", "squeezed", "kept", "measured", "sketched",
    "labelled", "compared", "admired", "guarded", "borrowed", "returned", "mended", "sorted",
    "swapped", "rinsed", "juggled", "dusted off",
)
ADVERBS = (
    "carefully", "slowly", "quickly", "gently", "proudly", "quietly", "eagerly", "softly",
    "patiently", "neatly", "secretly", "closely", "with great care", "twice", "again and again",
    "for a long time", "in the sunlight", "by the window", "without a word", "cheerfully",
    "thoughtfully", "nervously", "curiously", "boldly", "clumsily", "silently", "calmly",
    "politely", "tenderly", "at once",
)
LANDMARKS = (
    "windmill", "lighthouse", "waterfall", "castle", "tower", "bridge", "cliff", "valley",
    "canyon", "volcano", "barn", "chimney", "statue", "fountain", "tunnel", "hedge", "well",
    "cottage", "church", "clock tower", "ship", "tree house", "mountain", "glacier", "forest",
    "village", "cave", "garden", "orchard", "swamp", "haystack", "scarecrow", "cabin", "tent",
    "pagoda", "temple", "pyramid", "palace", "harbor", "factory", "observatory", "greenhouse",
    "dam", "canal", "quarry", "vineyard", "monastery", "fortress", "waterwheel", "aqueduct",
)
CHORES = (
    "wash the dishes", "sweep the floor", "fold the laundry", "feed the chickens",
    "water the plants", "mend the fence", "paint the gate", "stack the firewood",
    "hang the washing", "dust the shelves", "peel the potatoes", "set the table",
    "make the beds", "rake the leaves", "milk the goat", "polish the boots", "shovel the snow",
    "weed the garden", "bake the bread", "tidy the toy box", "walk the dog", "pick the beans",
)
BOOK_TOPICS = (
    "pirates", "volcanoes", "the deep ocean", "knights and castles", "dinosaurs", "planets",
    "trains", "insects", "rainforests", "the north pole", "robots", "bridges", "the weather",
    "clocks", "honey bees", "whales", "deserts", "caves", "kites", "famous inventors",
    "sailing ships", "the human body", "mountains", "spiders", "the moon", "magic tricks",
    "the history of bread", "lighthouses", "mushrooms", "bird songs",
)
JOBS = (
    "astronaut", "vet", "firefighter", "baker", "pilot", "scientist", "musician", "carpenter",
    "zookeeper", "librarian", "sailor", "painter", "gardener", "doctor", "inventor", "explorer",
    "dancer", "chef", "teacher", "photographer", "architect", "mechanic", "farmer",
    "detective", "writer", "builder", "nurse", "singer", "potter", "beekeeper",
)
GESTURES = (
    "scratched {his} head", "rubbed {his} eyes", "clapped {his} hands", "stamped {his} feet",
    "shrugged {his} shoulders", "wiggled {his} toes", "waved {his} arms", "folded {his} arms",
    "tilted {his} head", "wrinkled {his} nose", "bit {his} lip", "held {his} breath",
    "crossed {his} fingers", "tapped {his} chin", "puffed out {his} cheeks", "rolled up {his} sleeves",
)
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
)

MEMORIES = (
    "grandpa taught the whole family to fish", "the river froze solid", "a balloon flew away over the roofs",
    "the big flood came", "a circus came to town", "the old tree fell in a storm",
    "everyone danced at the wedding", "a parrot learned to say hello", "the lights went out all night",
    "it snowed in the middle of spring", "a whale swam past the harbor", "the bakery gave away free buns",
    "a kite got tangled in the church tower", "the goat ate the mayor's hat",
    "a comet streaked across the night sky", "the pond was full of tadpoles",
)
# fmt: on
