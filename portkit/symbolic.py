"""Integer index expressions, simplified as they are built.

Every expression is a linear form `const + sum(coef * atom)` whose atoms are loop variables,
floor divisions and modulos. Each node knows its range [min, max], and that range is what folds
`(4*i + j) // 4` into `i` when 0 <= j < 4: the div/mod folding that turns view arithmetic back
into plain strided indexing. Views (portkit/view.py) build these; codegen lowers them to ABI ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd


@dataclass(frozen=True)
class Var:
    """A loop counter or thread index with a known inclusive range."""

    name: str
    min: int
    max: int


@dataclass(frozen=True)
class Div:
    """floor(expr / divisor), divisor > 0."""

    expr: Lin
    divisor: int

    @property
    def min(self) -> int:
        return self.expr.min // self.divisor

    @property
    def max(self) -> int:
        return self.expr.max // self.divisor


@dataclass(frozen=True)
class Mod:
    """expr - divisor * floor(expr / divisor): always in [0, divisor)."""

    expr: Lin
    divisor: int

    @property
    def min(self) -> int:
        return 0

    @property
    def max(self) -> int:
        return self.divisor - 1


Atom = Var | Div | Mod


@dataclass(frozen=True)
class Lin:
    """const + sum(coef * atom), with atoms unique and coefficients non-zero."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @property
    def min(self) -> int:
        return self.const + sum(c * (a.min if c > 0 else a.max) for a, c in self.terms)

    @property
    def max(self) -> int:
        return self.const + sum(c * (a.max if c > 0 else a.min) for a, c in self.terms)

    def __add__(self, other: Lin | int) -> Lin:
        if isinstance(other, int):
            return Lin(self.terms, self.const + other) if other else self
        if not self.terms:
            return other + self.const
        merged = dict(self.terms)
        for atom, coef in other.terms:
            merged[atom] = merged.get(atom, 0) + coef
        return Lin(tuple((a, c) for a, c in merged.items() if c), self.const + other.const)

    def __mul__(self, factor: int) -> Lin:
        if factor == 0:
            return Lin()
        return Lin(tuple((a, c * factor) for a, c in self.terms), self.const * factor)

    def __floordiv__(self, divisor: int) -> Lin:
        if divisor == 1:
            return self
        whole, rest = self._split(divisor)
        if 0 <= rest.min and rest.max < divisor:
            return whole
        near, small = self._split_nearest(divisor)
        if 0 <= small.min and small.max < divisor:
            return near
        g = gcd(divisor, rest.const, *(c for _, c in rest.terms))
        if g > 1:
            return whole + Lin(tuple((a, c // g) for a, c in rest.terms),
                               rest.const // g) // (divisor // g)
        g, scaled, _ = rest._common(divisor)
        if g > 1:   # (g*x + s) // (g*d) == x // d for 0 <= s < g
            return whole + scaled // (divisor // g)
        if rest.const == 0 and len(rest.terms) == 1 and rest.terms[0][1] == 1:
            atom = rest.terms[0][0]
            if isinstance(atom, Div):     # (x // a) // b == x // (a * b)
                return whole + atom.expr // (atom.divisor * divisor)
        if rest.min == rest.max:
            return whole + rest.min // divisor
        return whole + atom_lin(Div(rest, divisor))

    def __mod__(self, divisor: int) -> Lin:
        if divisor == 1:
            return Lin()
        _, rest = self._split(divisor)
        if 0 <= rest.min and rest.max < divisor:
            return rest
        _, small = self._split_nearest(divisor)
        if 0 <= small.min and small.max < divisor:
            return small
        if rest.min == rest.max:
            return Lin((), rest.min % divisor)
        g = gcd(divisor, rest.const, *(c for _, c in rest.terms))
        if g > 1:   # (g*x) % (g*d) == g * (x % d)
            return Lin(tuple((a, c // g) for a, c in rest.terms), rest.const // g) % (
                divisor // g) * g
        g, scaled, small = rest._common(divisor)
        if g > 1:   # (g*x + s) % (g*d) == g * (x % d) + s for 0 <= s < g
            return (scaled % (divisor // g)) * g + small
        return atom_lin(Mod(rest, divisor))

    def _common(self, divisor: int) -> tuple[int, Lin, Lin]:
        """(g, x, s) with self == g*x + s, g > 1 dividing divisor and 0 <= s < g, so that
        self // (g*d) == x // d: a lane of an aligned tile, a row of a tile grid; else
        (1, self, 0)."""
        for g in sorted({gcd(divisor, c) for _, c in self.terms}, reverse=True):
            # the constant's multiple of g goes with x: (16000*r + 2000 + 16*c) // 70000 is
            # (8*r + 1) // 35 for 16*c < 2000 (a row of a (16, 35) grid of 2000-long rows)
            big = Lin(tuple((a, c // g) for a, c in self.terms if c % g == 0), self.const // g)
            small = Lin(tuple((a, c) for a, c in self.terms if c % g), self.const % g)
            if g > 1 and big.terms and 0 <= small.min and small.max < g:
                return g, big, small
        return 1, self, Lin()

    def _split_nearest(self, divisor: int) -> tuple[Lin, Lin]:
        """(q, r) with self == divisor*q + r, each coefficient of r in (-divisor/2, divisor/2]:
        a padded window's `(x + 59*k) % 58` is `x + k`, which folds when x + k < 58."""
        whole, rest = [], []
        for atom, coef in self.terms:
            low = coef % divisor
            low = low - divisor if 2 * low > divisor else low
            whole += [(atom, (coef - low) // divisor)] if coef != low else []
            rest += [(atom, low)] if low else []
        return (Lin(tuple(whole), self.const // divisor),
                Lin(tuple(rest), self.const % divisor))

    def _split(self, divisor: int) -> tuple[Lin, Lin]:
        """(q, r) with self == divisor*q + r, q holding every term divisor divides."""
        whole = tuple((a, c // divisor) for a, c in self.terms if c % divisor == 0)
        rest = tuple((a, c) for a, c in self.terms if c % divisor)
        return Lin(whole, self.const // divisor), Lin(rest, self.const % divisor)


def recombine(expr: Lin) -> Lin:
    """Undoes unravel-then-ravel: k*(x%a) + k*a*(x//a) -> k*x, and
    k*(x%a) + k*a*((x//a)%b) -> k*(x%(a*b)), repeatedly."""
    terms = dict(expr.terms)
    changed = True
    while changed:
        changed = False
        for atom, k in list(terms.items()):
            if not isinstance(atom, Mod) or atom not in terms:
                continue
            x, a = atom.expr, atom.divisor
            quotient = x // a
            if len(quotient.terms) != 1 or quotient.const or quotient.terms[0][1] != 1:
                continue
            q = quotient.terms[0][0]
            for other, coef in list(terms.items()):
                if coef != k * a:
                    continue
                if other == q:
                    replacement = x * k
                elif isinstance(other, Mod) and atom_lin(q) == other.expr:
                    replacement = (x % (a * other.divisor)) * k
                else:
                    continue
                del terms[atom], terms[other]
                rest = Lin(tuple(terms.items()), 0) + replacement
                terms = dict(rest.terms)
                expr = Lin((), expr.const + rest.const)
                changed = True
                break
            if changed:
                break
    return Lin(tuple(terms.items()), expr.const)


def atom_lin(atom: Atom) -> Lin:
    """The expression 1 * atom."""
    return Lin(((atom, 1),))


def var(name: str, lo: int, hi: int) -> Lin:
    """A variable ranging over lo..hi inclusive; a constant when lo == hi."""
    return Lin((), lo) if lo == hi else atom_lin(Var(name, lo, hi))


def const(value: int) -> Lin:
    """A constant expression."""
    return Lin((), value)


@dataclass(frozen=True)
class Bound:
    """The condition lo <= expr < hi, part of a view's validity mask."""

    expr: Lin
    lo: int
    hi: int


def bounds(conditions: list[Bound]) -> tuple[Bound, ...] | None:
    """The conditions that range analysis cannot decide; None if one is always false."""
    kept = []
    for b in conditions:
        if b.expr.max < b.lo or b.expr.min >= b.hi or b.lo >= b.hi:
            return None
        if not (b.expr.min >= b.lo and b.expr.max < b.hi):
            kept.append(b)
    return tuple(kept)


def ravel(index: list[Lin], shape: tuple[int, ...]) -> Lin:
    """The row-major flat index of a multi-index into `shape` (unravel's inverse); size-1
    axes add nothing."""
    strides, stride = [], 1
    for size in reversed(shape):
        strides.append(stride if size != 1 else 0)
        stride *= size
    return recombine(sum((i * s for i, s in zip(index, reversed(strides)) if s), Lin()))


def unravel(flat: Lin, shape: tuple[int, ...]) -> list[Lin]:
    """The multi-index of a row-major flat index into `shape`."""
    out, stride = [], 1
    for size in reversed(shape):
        out.append(flat // stride % size if size != 1 else const(0))
        stride *= size
    return out[::-1]
