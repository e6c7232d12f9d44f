"""Category tree, top-category shares and the word lists titles, params and reviews are made of.

41 top categories (UserArena counts 41 among its clicks). ``CLICK_SHARES`` are the
paper's click shares (apparel 54.90 %, jewellery 5.77 %, bags 4.83 %, the rest a
decreasing tail); ``L1_SHARES`` the catalog/affinity base shares that produce them.
Names never contain "-" because the category path is "L1-L2-L3".
"""

from __future__ import annotations

import numpy as np

# "L1: L2>L3,L3; L2>L3,..."  one line per top category, most clicked first.
_TREE = """
Apparel: Women>Dresses,Blouses,Skirts,Jeans,Knitwear,Coats; Men>Shirts,Trousers,Jackets,Hoodies,Tees; \
Kids>Rompers,Pyjamas,Outerwear; Underwear>Bras,Socks,Loungewear; Sportswear>Leggings,Tracksuits,Jerseys
Jewellery: Necklaces>Pendants,Chokers,Chains; Earrings>Stud earrings,Hoop earrings,Drop earrings; \
Rings>Band rings,Solitaire rings; Bracelets>Bangles,Charms
Bags: Handbags>Totes,Crossbody bags,Clutches; Backpacks>Daypacks,Laptop backpacks; Wallets>Cardholders,Purses
Shoes: Women>Pumps,Ballet flats,Ankle boots; Men>Sneakers,Loafers,Chelsea boots; Kids>Sandals,Trainers
Beauty: Makeup>Lipsticks,Foundations,Mascaras; Skincare>Serums,Moisturisers,Cleansers; \
Fragrance>Perfumes,Mists
Home: Decor>Vases,Frames,Candles; Textiles>Cushions,Throws,Curtains; Storage>Baskets,Organisers
Kitchen: Cookware>Pans,Pots,Woks; Tableware>Plates,Mugs,Glasses; Utensils>Knives,Spatulas
Electronics: Audio>Headphones,Earbuds,Speakers; Wearables>Smartwatches,Fitness bands; \
Accessories>Chargers,Cables,Power banks
Phones: Handsets>Smartphones,Feature phones; Cases>Phone cases,Screen protectors
Computers: Laptops>Ultrabooks,Gaming laptops; Peripherals>Keyboards,Mice,Monitors; Storage>SSDs,USB drives
Toys: Building>Block sets,Model kits; Dolls>Fashion dolls,Plush toys; Games>Puzzles,Board games
Baby: Feeding>Bottles,Bibs; Nursery>Cribs,Mobiles; Care>Diapers,Wipes
Sports: Fitness>Yoga mats,Dumbbells,Resistance bands; Cycling>Helmets,Bike lights; \
Ball sports>Footballs,Rackets
Outdoor: Camping>Tents,Sleeping bags,Lanterns; Hiking>Trekking poles,Water bottles
Books: Fiction>Novels,Thrillers; Nonfiction>Biographies,Cookbooks; Children>Picture books,Activity books
Stationery: Writing>Pens,Pencils,Markers; Paper>Notebooks,Planners; Desk>Desk organisers,Staplers
Pets: Dogs>Dog beds,Leashes,Dog food; Cats>Cat trees,Cat litter,Cat food
Food: Snacks>Crisps,Nuts,Chocolate; Pantry>Pasta,Sauces,Spices
Drinks: Coffee>Coffee beans,Capsules; Tea>Green tea,Herbal tea
Health: Supplements>Vitamins,Protein powders; Devices>Thermometers,Massagers
Personal care: Hair>Shampoos,Hair dryers; Oral>Toothbrushes,Toothpaste; Shaving>Razors,Trimmers
Furniture: Living>Sofas,Coffee tables; Bedroom>Wardrobes,Nightstands; Office>Desks,Office chairs
Lighting: Lamps>Desk lamps,Floor lamps; Bulbs>LED bulbs,Smart bulbs; Strings>Fairy lights
Garden: Plants>Seeds,Planters; Tools>Hoses,Pruners; Furniture>Loungers,Parasols
Tools: Power>Drills,Sanders; Hand>Screwdrivers,Wrenches; Measuring>Tape measures,Spirit levels
Automotive: Interior>Seat covers,Phone mounts; Care>Car wax,Car vacuums; Electronics>Dash cams,Car chargers
Watches: Men>Chronographs,Dress watches; Women>Fashion watches,Bracelet watches
Eyewear: Sunglasses>Aviators,Cat eye sunglasses; Frames>Optical frames,Reading glasses
Luggage: Suitcases>Carry ons,Checked cases; Travel>Packing cubes,Toiletry bags
Music: Instruments>Guitars,Digital pianos,Ukuleles; Accessories>Guitar strings,Tuners
Games: Consoles>Handheld consoles,Controllers; Titles>Action games,Puzzle games
Crafts: Knitting>Yarn,Knitting needles; Painting>Acrylics,Brushes,Canvases
Party: Decorations>Balloons,Banners; Tableware>Paper plates,Napkins
Bedding: Sheets>Fitted sheets,Pillowcases; Duvets>Duvets,Pillows
Bath: Towels>Bath towels,Hand towels; Accessories>Bath mats,Shower curtains
Cleaning: Supplies>Sprays,Sponges,Mops; Laundry>Detergents,Drying racks
Appliances: Small>Kettles,Toasters,Blenders; Climate>Fans,Heaters,Humidifiers
Cameras: Bodies>Mirrorless cameras,Action cameras; Accessories>Tripods,Memory cards
Office: Equipment>Printers,Shredders; Comfort>Desk mats,Footrests
Travel: Accessories>Neck pillows,Travel adapters; Gear>Travel wallets,Luggage tags
Gifts: Sets>Gift boxes,Hampers; Cards>Greeting cards,Gift wrap
"""


def _parse(tree: str) -> list[tuple[str, str, str]]:
    leaves = []
    for line in tree.strip().splitlines():
        l1, rest = line.split(":", 1)
        for part in rest.split(";"):
            l2, l3s = part.strip().split(">")
            leaves += [(l1.strip(), l2.strip(), l3.strip()) for l3 in l3s.split(",")]
    return leaves


LEAVES: list[tuple[str, str, str]] = _parse(_TREE)
L1_NAMES: tuple[str, ...] = tuple(dict.fromkeys(leaf[0] for leaf in LEAVES))
N_L1 = len(L1_NAMES)
LEAF_L1: np.ndarray = np.array([L1_NAMES.index(leaf[0]) for leaf in LEAVES], dtype=np.int16)
LEAF_PATH: np.ndarray = np.array(["-".join(leaf) for leaf in LEAVES], dtype=object)
APPAREL = L1_NAMES.index("Apparel")

# Click shares to reproduce: the three named by the paper, then a 1/k tail over the other 38.
_HEAD = np.array([0.549, 0.0577, 0.0483])
_tail = 1.0 / np.arange(3, N_L1 + 3 - 3) ** 0.85
CLICK_SHARES: np.ndarray = np.concatenate([_HEAD, _tail / _tail.sum() * (1.0 - _HEAD.sum())])
# Catalog / affinity base shares. Shoppers over-click their relatively favourite (often small)
# categories, so apparel needs a larger base share than its click share (tuned on simulations).
_CORRECTION = np.r_[1.24, 1.15, 1.15, np.ones(N_L1 - 3)]
L1_SHARES: np.ndarray = CLICK_SHARES * _CORRECTION / (CLICK_SHARES * _CORRECTION).sum()

# Median price per top category (currency units), same order as L1_NAMES.
L1_PRICE: np.ndarray = np.array(
    [
        29,
        45,
        39,
        49,
        22,
        25,
        24,
        59,
        199,
        399,
        25,
        18,
        30,
        45,
        14,
        8,
        20,
        9,
        14,
        25,
        19,
        249,
        35,
        30,
        49,
        25,
        99,
        35,
        89,
        119,
        45,
        15,
        10,
        39,
        19,
        12,
        49,
        229,
        79,
        19,
        25,
    ],
    dtype=np.float64,
)

# Which word/param family a top category uses.
FAMILY: dict[str, str] = {
    **dict.fromkeys(["Apparel", "Shoes"], "fashion"),
    **dict.fromkeys(["Bags", "Jewellery", "Watches", "Eyewear", "Luggage"], "accessory"),
    **dict.fromkeys(["Electronics", "Phones", "Computers", "Cameras", "Games", "Appliances"], "tech"),
    **dict.fromkeys(["Home", "Kitchen", "Furniture", "Lighting", "Bedding", "Bath", "Garden"], "home"),
}
FAMILIES: tuple[str, ...] = ("fashion", "accessory", "tech", "home", "general")
L1_FAMILY: np.ndarray = np.array([FAMILIES.index(FAMILY.get(n, "general")) for n in L1_NAMES], dtype=np.int8)

_KEEP_PLURAL = (
    "Jeans",
    "Trousers",
    "Leggings",
    "Glasses",
    "glasses",
    "Pyjamas",
    "Socks",
    "Sunglasses",
    "sunglasses",
    "Nuts",
    "Crisps",
    "Wipes",
    "Diapers",
    "Spices",
    "Pasta",
)


_IRREGULAR = {"Hoodies": "Hoodie", "Knives": "Knife", "Mice": "Mouse", "Canvases": "Canvas"}


def singular(noun: str) -> str:
    """Crude singular for titles ("Midi Dresses" -> "Midi Dress"); a few plural-only nouns are kept."""
    if noun in _IRREGULAR:
        return _IRREGULAR[noun]
    if noun.endswith(_KEEP_PLURAL) or not noun.endswith("s"):
        return noun
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    if noun.endswith(("sses", "shes", "ches", "xes")):
        return noun[:-2]
    return noun[:-1]


LEAF_NOUN: np.ndarray = np.array([singular(leaf[2]) for leaf in LEAVES], dtype=object)

_SYLLABLES_A = [
    "Lu",
    "Ve",
    "Ka",
    "No",
    "Ari",
    "Sol",
    "Mi",
    "Tor",
    "Zen",
    "Ela",
    "Bri",
    "Co",
    "Da",
    "Fi",
    "Ga",
    "Ho",
    "Iv",
    "Jo",
    "Mar",
    "Ne",
    "Or",
    "Pe",
    "Qui",
    "Ro",
]
_SYLLABLES_B = [
    "mora",
    "lia",
    "stra",
    "vio",
    "nex",
    "rella",
    "dane",
    "via",
    "tek",
    "sso",
    "lune",
    "ber",
    "ano",
    "ique",
    "ora",
    "lex",
]
BRANDS: np.ndarray = np.array([a + b for a in _SYLLABLES_A for b in _SYLLABLES_B], dtype=object)

STYLE_WORDS: dict[str, list[str]] = {
    "fashion": [
        "Oversized",
        "Slim Fit",
        "Vintage",
        "Classic",
        "Minimalist",
        "Boho",
        "Casual",
        "Elegant",
        "Relaxed",
        "Cropped",
        "High Waist",
        "Chic",
        "Retro",
        "Everyday",
        "Statement",
    ],
    "accessory": [
        "Dainty",
        "Layered",
        "Vintage",
        "Minimalist",
        "Statement",
        "Classic",
        "Everyday",
        "Travel",
        "Hypoallergenic",
        "Adjustable",
        "Personalised",
    ],
    "tech": [
        "Wireless",
        "Portable",
        "Fast Charging",
        "Noise Cancelling",
        "Compact",
        "Pro",
        "Ultra Slim",
        "Smart",
        "4K",
        "Bluetooth 5.3",
        "Waterproof",
        "Ergonomic",
    ],
    "home": [
        "Nordic",
        "Handmade",
        "Rustic",
        "Modern",
        "Stackable",
        "Foldable",
        "Scandi",
        "Cosy",
        "Non Stick",
        "Space Saving",
        "Minimalist",
    ],
    "general": [
        "Premium",
        "Value Pack",
        "Organic",
        "Family Size",
        "Travel Size",
        "Eco",
        "Deluxe",
        "Classic",
        "Easy Care",
        "Long Lasting",
        "Gift Ready",
    ],
}
MATERIAL_WORDS: dict[str, list[str]] = {
    "fashion": [
        "Cotton",
        "Linen",
        "Silk",
        "Wool",
        "Denim",
        "Leather",
        "Satin",
        "Cashmere",
        "Suede",
        "Corduroy",
        "Canvas",
        "Knit",
    ],
    "accessory": [
        "Sterling Silver",
        "Gold Plated",
        "Pearl",
        "Leather",
        "Vegan Leather",
        "Titanium",
        "Rose Gold",
        "Nylon",
        "Polycarbonate",
        "Acetate",
    ],
    "tech": ["Aluminium", "Matte Black", "Silver", "Graphite", "Pearl White", "Carbon", "Midnight Blue"],
    "home": ["Ceramic", "Oak", "Bamboo", "Glass", "Stainless Steel", "Velvet", "Rattan", "Marble", "Cotton"],
    "general": ["Natural", "Original", "Lemon", "Lavender", "Unscented", "Assorted", "Mint", "Classic"],
}
PARAM_LABELS: dict[str, list[str]] = {
    "fashion": ["Material", "Colour", "Size", "Fit", "Season", "Style"],
    "accessory": ["Material", "Colour", "Dimensions", "Style", "Weight", "Origin"],
    "tech": ["Colour", "Connectivity", "Battery", "Warranty", "Model year", "Weight"],
    "home": ["Material", "Colour", "Dimensions", "Care", "Style", "Weight"],
    "general": ["Colour", "Material", "Origin", "Weight", "Pack size", "Shelf life"],
}
PARAM_VALUES: dict[str, list[str]] = {
    "Material": ["Cotton", "Linen", "Polyester", "Wool blend", "Leather", "Ceramic", "Bamboo", "Steel"],
    "Colour": ["Black", "White", "Navy", "Beige", "Sage green", "Burgundy", "Grey", "Pink", "Sky blue"],
    "Size": ["XS", "S", "M", "L", "XL", "One size", "EU 38", "EU 42"],
    "Fit": ["Regular", "Slim", "Loose", "Oversized"],
    "Season": ["Spring", "Summer", "Autumn", "Winter", "All season"],
    "Style": ["Casual", "Formal", "Street", "Minimalist", "Vintage"],
    "Connectivity": ["Bluetooth", "USB-C", "Wi-Fi", "Wired", "NFC"],
    "Battery": ["10 h", "20 h", "30 h", "5000 mAh", "None"],
    "Warranty": ["1 year", "2 years", "3 years"],
    "Model year": ["2022", "2023", "2024"],
    "Weight": ["120 g", "250 g", "500 g", "1 kg", "2.5 kg"],
    "Dimensions": ["20 x 20 cm", "30 x 40 cm", "45 x 45 cm", "120 x 60 cm"],
    "Care": ["Machine wash", "Hand wash", "Wipe clean", "Dishwasher safe"],
    "Origin": ["China", "Vietnam", "Italy", "Turkey", "Portugal", "Japan"],
    "Pack size": ["1 pc", "2 pcs", "3 pcs", "6 pcs", "12 pcs"],
    "Shelf life": ["6 months", "12 months", "24 months"],
}
REVIEW_OPENERS = [
    "Love it",
    "Good value",
    "Arrived quickly",
    "As described",
    "Not bad",
    "Excellent quality",
    "Runs a bit small",
    "Pricey but worth it",
    "Very happy",
    "Okay for the price",
    "Disappointed",
    "Second time buying",
    "Exactly what I needed",
    "Looks cheaper in person",
    "Great gift",
    "Solid",
]
REVIEW_CLOSERS = [
    "the colour matches the photos",
    "would buy again",
    "packaging was slightly damaged",
    "fits perfectly",
    "material feels thin",
    "delivery took a week",
    "my daughter loves it",
    "works as expected",
    "size up if unsure",
    "seller answered fast",
    "smells a bit at first",
    "much better than my old one",
    "stitching could be better",
    "five stars from me",
    "does the job",
    "returned it for a bigger size",
]
