"""The pool's warm sandboxes, kept per image: which images, how many of each, what to start next.

Bookkeeping only (no I/O, no clock): `SandboxPool` starts and stops the sandboxes. The
backend's default image (key None) is always kept warm; any other image is kept warm
from its first request on, up to `warm_images` images besides the default, the least
recently asked dropped first (its warm sandboxes are handed back to be stopped). Each
kept image gets up to `warm_pool` sandboxes; refills in flight, all images together,
stay within `warm_starting`, handed to the image that lacks the most.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from sandboxes.base import Sandbox

Image = str | None


class WarmShelves:
    def __init__(self, per_image: int, max_images: int, max_starting: int) -> None:
        self.per_image = per_image
        self.max_images = max_images
        self.max_starting = max_starting
        self._shelves: dict[Image, deque[Sandbox]] = {None: deque()}
        self._pending: dict[Image, int] = {None: 0}
        self._recent: OrderedDict[str, None] = OrderedDict()  # images besides the default, oldest first

    def count(self) -> int:
        return sum(len(shelf) for shelf in self._shelves.values())

    def asked(self, image: Image) -> list[Sandbox]:
        """Note a request for `image`; returns the warm sandboxes of images no longer kept."""
        if image is None or self.per_image <= 0:
            return []
        if image in self._recent:
            self._recent.move_to_end(image)
            return []
        self._recent[image] = None
        self._shelves.setdefault(image, deque())
        self._pending.setdefault(image, 0)
        dropped: list[Sandbox] = []
        while len(self._recent) > self.max_images:
            old, _ = self._recent.popitem(last=False)
            dropped.extend(self._shelves.pop(old, ()))
        return dropped

    def take(self, image: Image, fits: Callable[[Sandbox], bool]) -> Sandbox | None:
        shelf = self._shelves.get(image)
        if shelf and fits(shelf[0]):
            return shelf.popleft()
        return None

    def to_start(self) -> list[Image]:
        """Images to start one more warm sandbox for now (each counted as pending)."""
        chosen: list[Image] = []
        in_flight = sum(self._pending.values())
        while in_flight < self.max_starting:
            lacking = {
                image: self.per_image - len(shelf) - self._pending.get(image, 0)
                for image, shelf in self._shelves.items()
            }
            image, lack = max(lacking.items(), key=lambda item: item[1], default=(None, 0))
            if lack <= 0:
                break
            self._pending[image] = self._pending.get(image, 0) + 1
            chosen.append(image)
            in_flight += 1
        return chosen

    def started(self, image: Image, box: Sandbox | None) -> bool:
        """A warm start for `image` ended (`box` None if it failed); False: `box` is not kept."""
        self._pending[image] = max(self._pending.get(image, 0) - 1, 0)
        shelf = self._shelves.get(image)
        if box is None or shelf is None:
            return False
        shelf.append(box)
        return True

    def drain(self) -> list[Sandbox]:
        """Every warm sandbox, removed from the shelves (the pool is closing)."""
        boxes = [box for shelf in self._shelves.values() for box in shelf]
        for shelf in self._shelves.values():
            shelf.clear()
        return boxes
