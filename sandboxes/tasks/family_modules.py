"""The modules of the learning task family: small libraries of one-line functions.

Each `Module` is a theme (a library a user might have) of `Function`s whose body is
one `return` expression, with the argument tuples its tests call it with. Which bug
kinds a function can carry follows from its expression (`sandboxes.tasks.family`
decides; see `kind_sources`); every task's library holds all of a module's functions
and four renamed copies of them, each with one kind's injection on its line (the bug,
or a decoy whose tests expect what it computes), so every module needs a function of
each kind. The train and held-out splits use disjoint modules,
so held-out tasks are code the policy never saw in RL or SFT, as the reference run's
evaluation repositories were disjoint from its RL repositories.

Rules every expression keeps, so each bug's telltale is unambiguous and each fix's
pattern matches only the injected line: no ` < ` (use `<=`, `>=`, `>`), no `min(`,
no `not `, and no expression ending in ` + 1`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    params: str
    expr: str
    cases: tuple[tuple[object, ...], ...]


@dataclass(frozen=True)
class Module:
    name: str
    doc: str
    functions: tuple[Function, ...]


F = Function

TRAIN_MODULES: tuple[Module, ...] = (
    Module(
        "geometry",
        "Shapes on a grid.",
        (
            F("area", "width, height", "width * height", ((3, 4), (0, 5), (2, 7))),
            F("fits", "size, limit", "size <= limit", ((3, 4), (4, 4), (5, 4))),
            F("longest_side", "a, b", "max(a, b)", ((1, 2), (5, 3), (4, 4))),
            F("is_square", "width, height", "width == height", ((2, 2), (2, 3))),
            F("perimeter", "width, height", "2 * (width + height)", ((1, 2), (3, 3))),
        ),
    ),
    Module(
        "shop",
        "Prices and baskets.",
        (
            F("total", "price, count", "price * count", ((3, 4), (5, 0), (2, 2))),
            F("affordable", "price, budget", "price <= budget", ((3, 5), (5, 5), (6, 5))),
            F("best_price", "a, b", "max(a, b)", ((10, 8), (3, 9), (4, 4))),
            F("in_stock", "count", "count > 0", ((0,), (3,))),
            F("discounted", "price, off", "price - off", ((10, 3), (5, 5))),
        ),
    ),
    Module(
        "grades",
        "Scores of a class.",
        (
            F("passed", "score, bar", "score >= bar", ((50, 50), (49, 50), (70, 50))),
            F("within_max", "score, top", "score <= top", ((90, 100), (100, 100), (101, 100))),
            F("better", "a, b", "max(a, b)", ((61, 72), (88, 80))),
            F("points", "right, weight", "right * weight", ((7, 2), (0, 3), (4, 4))),
            F("is_perfect", "score, top", "score == top", ((100, 100), (99, 100))),
        ),
    ),
    Module(
        "clock",
        "Hours and minutes.",
        (
            F("minutes", "hours", "hours * 60", ((2,), (0,), (5,))),
            F("before_noon", "hour", "hour <= 11", ((9,), (11,), (12,))),
            F("later", "a, b", "max(a, b)", ((7, 9), (12, 3))),
            F("is_midnight", "hour", "hour == 0", ((0,), (5,))),
            F("seconds", "minutes", "minutes * 60", ((3,), (1,))),
        ),
    ),
    Module(
        "bank",
        "Accounts and balances.",
        (
            F("balance", "deposits, withdrawals", "deposits - withdrawals", ((10, 4), (5, 5), (9, 1))),
            F("can_withdraw", "amount, balance", "amount <= balance", ((5, 9), (9, 9), (10, 9))),
            F("larger_account", "a, b", "max(a, b)", ((100, 250), (90, 40))),
            F("solvent", "balance", "balance >= 0", ((0,), (3,), (-2,))),
            F("interest", "balance, rate", "balance * rate", ((100, 2), (7, 3))),
        ),
    ),
    Module(
        "weather",
        "Daily readings.",
        (
            F("warm", "temp, threshold", "temp >= threshold", ((20, 20), (19, 20), (25, 20))),
            F("frost", "temp", "temp <= 0", ((0,), (-3,), (2,))),
            F("peak", "morning, noon", "max(morning, noon)", ((12, 18), (20, 15))),
            F("spread", "high, low", "high - low", ((20, 12), (8, 8))),
            F("same_day", "a, b", "a == b", ((3, 3), (3, 4))),
        ),
    ),
    Module(
        "library",
        "Books and loans.",
        (
            F("pages_left", "pages, read", "pages - read", ((300, 120), (50, 50))),
            F("due", "day, limit", "day <= limit", ((10, 14), (14, 14), (15, 14))),
            F("thicker", "a, b", "max(a, b)", ((320, 210), (100, 400))),
            F("shelf_width", "books, width", "books * width", ((12, 3), (0, 4), (5, 5))),
            F("available", "copies", "copies > 0", ((0,), (2,))),
        ),
    ),
    Module(
        "garden",
        "Beds and plants.",
        (
            F("plants", "rows, per_row", "rows * per_row", ((4, 6), (0, 3), (3, 3))),
            F("enough_water", "litres, need", "litres >= need", ((5, 5), (4, 5), (9, 5))),
            F("tallest", "a, b", "max(a, b)", ((30, 45), (60, 20))),
            F("fits_bed", "plants, room", "plants <= room", ((8, 10), (10, 10), (11, 10))),
            F("bare", "plants", "plants == 0", ((0,), (4,))),
        ),
    ),
    Module(
        "travel",
        "Trips and distances.",
        (
            F("distance", "speed, hours", "speed * hours", ((60, 2), (0, 3), (45, 4))),
            F("within_range", "km, range_km", "km <= range_km", ((300, 400), (400, 400), (401, 400))),
            F("farther", "a, b", "max(a, b)", ((120, 80), (30, 95))),
            F("arrived", "left_km", "left_km == 0", ((0,), (12,))),
            F("on_budget", "cost, budget", "cost <= budget", ((80, 100), (100, 100), (120, 100))),
        ),
    ),
    Module(
        "sports",
        "Teams and scores.",
        (
            F("goal_difference", "scored, conceded", "scored - conceded", ((5, 2), (3, 3))),
            F("qualifies", "points, cutoff", "points >= cutoff", ((30, 30), (29, 30), (41, 30))),
            F("winner_score", "home, away", "max(home, away)", ((2, 1), (0, 3), (2, 2))),
            F("under_limit", "players, limit", "players <= limit", ((10, 11), (11, 11), (12, 11))),
            F("season_points", "wins, per_win", "wins * per_win", ((7, 3), (0, 3), (4, 2))),
        ),
    ),
    Module(
        "storage",
        "Disks and files.",
        (
            F("used", "files, size", "files * size", ((30, 4), (0, 8), (5, 5))),
            F("fits_disk", "used_gb, disk_gb", "used_gb <= disk_gb", ((400, 500), (500, 500), (501, 500))),
            F("bigger_disk", "a, b", "max(a, b)", ((256, 512), (1000, 750))),
            F("free_space", "disk_gb, used_gb", "disk_gb - used_gb", ((500, 120), (64, 64))),
            F("is_empty", "files", "files == 0", ((0,), (3,))),
        ),
    ),
    Module(
        "parking",
        "Spaces and cars.",
        (
            F("cars_in", "arrived, left", "arrived - left", ((40, 15), (9, 9))),
            F("has_room", "cars, spaces", "cars <= spaces", ((45, 50), (50, 50), (51, 50))),
            F("longer_stay", "a, b", "max(a, b)", ((3, 7), (12, 5))),
            F("fee", "hours, rate", "hours * rate", ((3, 2), (0, 5), (4, 4))),
            F("within_hours", "hour, closing", "hour <= closing", ((20, 22), (22, 22), (23, 22))),
        ),
    ),
)

HELDOUT_MODULES: tuple[Module, ...] = (
    Module(
        "fleet",
        "Trucks and loads.",
        (
            F("payload", "trucks, tons", "trucks * tons", ((3, 8), (0, 5), (2, 2))),
            F("legal_load", "tons, cap", "tons <= cap", ((18, 20), (20, 20), (21, 20))),
            F("heavier", "a, b", "max(a, b)", ((12, 19), (25, 7))),
            F("empty", "tons", "tons == 0", ((0,), (6,))),
            F("fuel_left", "tank, used", "tank - used", ((80, 35), (40, 40))),
        ),
    ),
    Module(
        "kitchen",
        "Recipes and portions.",
        (
            F("portions", "guests, each", "guests * each", ((6, 2), (0, 3), (4, 4))),
            F("in_time", "minutes, limit", "minutes <= limit", ((25, 30), (30, 30), (31, 30))),
            F("hotter", "a, b", "max(a, b)", ((180, 220), (250, 200))),
            F("done", "cooked, needed", "cooked >= needed", ((10, 10), (9, 10), (12, 10))),
            F("leftover", "made, eaten", "made - eaten", ((12, 9), (5, 5))),
        ),
    ),
    Module(
        "network",
        "Hosts and packets.",
        (
            F("throughput", "packets, size", "packets * size", ((50, 4), (0, 9), (3, 3))),
            F("under_quota", "sent, quota", "sent <= quota", ((90, 100), (100, 100), (101, 100))),
            F("busiest", "a, b", "max(a, b)", ((340, 120), (80, 95))),
            F("online", "hosts", "hosts > 0", ((0,), (7,))),
            F("same_port", "a, b", "a == b", ((80, 80), (80, 443))),
        ),
    ),
    Module(
        "music",
        "Tracks and playlists.",
        (
            F("playtime", "tracks, length", "tracks * length", ((10, 3), (0, 4), (5, 5))),
            F("fits_side", "minutes, side", "minutes <= side", ((20, 22), (22, 22), (23, 22))),
            F("louder", "a, b", "max(a, b)", ((70, 85), (90, 60))),
            F("loud", "level, limit", "level >= limit", ((80, 80), (79, 80))),
            F("remaining", "total, played", "total - played", ((45, 20), (30, 30))),
        ),
    ),
)

SPLITS: dict[str, tuple[Module, ...]] = {"train": TRAIN_MODULES, "heldout": HELDOUT_MODULES}
