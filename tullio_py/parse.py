"""Text -> `Equation`.  Syntax only: ranges, dtypes and gradients are later stages.

The statement is split into reduction prefix `(op)`, left side, assignment operator, right side
and finaliser `|> f`; each side is parsed by Python's `ast` and converted through a whitelist.
Nothing the user writes is ever evaluated.
"""
from __future__ import annotations

import ast
import re

from .errors import ParseError
from .ir import (ASSIGN_OPS, BINARY_FUNCS, BOUNDARY_WRAPPERS, ELEMENTWISE_FUNCS, FINALISERS,
                 FUNCTIONS, REDUCTIONS, Access, Affine, Binary, Call, Compare, Const, Equation,
                 Gather, IndexValue, Param, Unary, Wrapped, walk)

MAX_LENGTH = 10_000
MAX_DEPTH = 200
_PREFIX = re.compile(r"\s*\(\s*([^()\s]*)\s*\)\s*")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def parse(text: str, extra_indices: tuple[str, ...] = ()) -> Equation:
    """Parse one tullio_py statement.  `extra_indices` are names given ranges by `ranges=`: they
    are indices even when no bracket uses them (`A[i] := i**2` with `ranges={"i": 10}`)."""
    if not isinstance(text, str):
        raise ParseError(f"an expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ParseError(f"expression too long: {len(text)} characters, at most {MAX_LENGTH}",
                         hint="split it into several statements")
    return _Parser(text, tuple(extra_indices)).equation()


def _written(a: Affine, span) -> Affine:
    """An index expression written with arithmetic; one that reduces to a plain index (`i+0`)
    stays a shifted use (it intersects extents instead of demanding equal ones)."""
    looks_bare = len(a.terms) == 1 and a.terms[0][1] == 1 and a.const == 0
    return Affine(a.terms, a.const, span, shifted=looks_bare)


class _Parser:
    def __init__(self, text: str, extra_indices: tuple[str, ...]):
        self.text = text
        self.extra = extra_indices

    def fail(self, rule: str, span=None, hint=None):
        raise ParseError(rule, self.text, span, hint)

    # --------------------------------------------------------------- splitting the statement
    def equation(self) -> Equation:
        text = self.text
        if "\n" in text.strip() or ";" in text:
            self.fail("one statement per call: newlines and ';' are not allowed",
                      (max(text.find("\n"), text.find(";")), max(text.find("\n"), text.find(";")) + 1))
        pos, reduction = 0, None
        self.prefix_span = self.fin_span = None
        m = _PREFIX.match(text)
        if m:
            reduction = m.group(1)
            if reduction not in REDUCTIONS:
                self.fail(f"unknown reduction '({reduction})': the reductions are "
                          + ", ".join(f"({r})" for r in REDUCTIONS), m.span(1) if reduction else m.span())
            pos = m.end()
            self.prefix_span = (m.start(), m.end())
        finaliser, end = None, len(text)
        fin_at = text.rfind("|>")
        if fin_at >= 0:
            fin_text = text[fin_at + 2:]
            finaliser = fin_text.strip()
            fspan = (fin_at + 2 + len(fin_text) - len(fin_text.lstrip()), len(text.rstrip()))
            if finaliser not in FINALISERS:
                self.fail(f"unknown finaliser '{finaliser}': a finaliser is one of "
                          + ", ".join(FINALISERS), fspan)
            end = fin_at
            self.fin_span = (fin_at, fspan[1])
        op, op_at = self.find_assignment(pos, end)
        lhs_span = (pos, op_at)
        rhs_span = (op_at + len(op), end)
        lhs_tree = self.python_ast(*lhs_span, brackets_only=True)
        rhs_tree = self.python_ast(*rhs_span, brackets_only=True)
        self.index_names = set(self.extra) | self.bracket_names(lhs_tree) | self.bracket_names(rhs_tree)
        lhs = self.lhs(lhs_tree, op)
        rhs = self.expr(rhs_tree)
        eq = Equation(lhs, op, rhs, reduction, finaliser, text)
        self.check_rules(eq, op_at, rhs_span)
        return eq

    def find_assignment(self, start: int, end: int) -> tuple[str, int]:
        text, depth = self.text, 0
        i = start
        while i < end:
            c = text[i]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
            elif depth == 0:
                two = text[i:i + 2]
                if two in (":=", "+=", "-=", "*="):
                    return two, i
                if two in ("/=", "^=", "%="):
                    self.fail(f"'{two}' is not an assignment tullio_py knows; use one of "
                              + " ".join(ASSIGN_OPS), (i, i + 2),
                              "write the update out, e.g. A[i] = A[i] / B[i]" if two == "/=" else None)
                if c == "=" and text[i + 1:i + 2] != "=" and (i == 0 or text[i - 1] not in "<>!=*/+-:^%"):
                    return "=", i
            i += 1
        self.fail("no assignment found: a statement looks like 'C[i,k] := A[i,j] * B[j,k]' "
                  "with one of " + " ".join(ASSIGN_OPS), (start, end))

    def python_ast(self, start: int, stop: int, brackets_only: bool) -> ast.expr:
        """Parse text[start:stop] with Python's ast.  Inside brackets, '2i' means '2*i'.  Returns
        the tree with col offsets mapped back to positions in self.text."""
        src, where, depth = [], [], 0
        piece = self.text[start:stop]
        for k, c in enumerate(piece):
            if c == "[":
                depth += 1
            elif c == "]":
                depth -= 1
            if (depth > 0 and c.isalpha() and k > 0 and piece[k - 1].isdigit()
                    and not re.search(r"[A-Za-z_]\w*$", piece[:k])):
                src.append("*")
                where.append(start + k)
            src.append(c)
            where.append(start + k)
        where.append(stop)
        code = "".join(src)
        if not code.strip():
            self.fail("missing expression", (start, max(stop, start + 1)))
        try:
            tree = ast.parse(code.strip(), mode="eval").body
        except SyntaxError as e:
            lead = len(code) - len(code.lstrip())
            off = lead + max((e.offset or 1) - 1, 0)
            at = where[min(off, len(where) - 1)]
            hint = "use ** for powers" if "^" in code else None
            self.fail(f"invalid syntax: {e.msg}", (at, at + 1), hint)
        except (RecursionError, MemoryError, ValueError):
            self.fail("expression too deeply nested", (start, stop))
        self.check_depth(tree, start, stop)
        lead = len(code) - len(code.lstrip())
        for node in ast.walk(tree):
            if hasattr(node, "col_offset"):
                a = lead + node.col_offset
                b = lead + (node.end_col_offset or node.col_offset + 1)
                node.span = (where[min(a, len(where) - 1)], where[min(b, len(where) - 1)])
        return tree

    def check_depth(self, tree, start: int, stop: int):
        """Every later stage walks the tree recursively: bound its depth here, iteratively."""
        stack = [(tree, 1)]
        while stack:
            node, d = stack.pop()
            if d > MAX_DEPTH:
                self.fail(f"expression nested too deeply (more than {MAX_DEPTH} levels; a long "
                          "chain of + counts one level per term)", (start, stop),
                          "split it into several statements")
            stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))

    @staticmethod
    def bracket_names(tree) -> set[str]:
        """Names used inside brackets (not as a gather's array name): these are indices."""
        names = set()

        def visit(node, inside):
            if isinstance(node, ast.Subscript):
                visit(node.value, inside and not isinstance(node.value, ast.Name))
                visit(node.slice, True)
                return
            if isinstance(node, ast.Name) and inside:
                names.add(node.id)
            if isinstance(node, ast.Call):   # the function name is not an index
                for a in node.args:
                    visit(a, inside)
                return
            for child in ast.iter_child_nodes(node):
                visit(child, inside)
        visit(tree, False)
        return names

    # --------------------------------------------------------------- left-hand side
    def lhs(self, node, op: str) -> Access:
        if isinstance(node, ast.Name):
            self.check_name(node)
            return Access(node.id, (), node.span)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            acc = self.access(node)
            for s in acc.indices:
                # A wrapped left position is a many-to-one scatter (the gradient of a clamp,
                # mod or padded read): every tuple adds into the element it hits (pad: writes
                # outside the array are dropped), so only the accumulating forms allow it.
                if isinstance(s, Wrapped) and (op not in ("+=", "-=") or s.lo is not None):
                    self.fail(f"{s.kind}(...) on the left-hand side accumulates into the element "
                              "it hits: it needs '+=' or '-='" + (" and no pad amounts"
                                                                 if s.kind == "pad" else ""),
                              s.span, "or move the boundary rule to a read on the right")
            return acc
        self.fail("the left-hand side must be an array with indices, like C[i,k], or a name for a "
                  "scalar result", node.span)

    # --------------------------------------------------------------- brackets
    def access(self, node: ast.Subscript) -> Access:
        if not isinstance(node.value, ast.Name):
            self.fail("only a named array can be indexed", node.value.span)
        self.check_name(node.value)
        if node.value.id in self.index_names:
            self.fail(f"'{node.value.id}' is used both as an index and as an array", node.value.span)
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if not elts:
            self.fail("empty brackets", node.span, "a scalar output is written without brackets")
        return Access(node.value.id, tuple(self.slot(e) for e in elts), node.span)

    def slot(self, node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in BOUNDARY_WRAPPERS:
            kind = node.func.id
            if node.keywords:
                self.fail(f"{kind}() takes no keywords", node.keywords[0].value.span)
            nargs = len(node.args)
            if nargs == 0 or (kind != "pad" and nargs != 1) or nargs > 3:
                self.fail(f"wrong number of arguments to {kind}(): use "
                          + ("pad(e), pad(e, n) or pad(e, lo, hi)" if kind == "pad" else f"{kind}(e)"),
                          node.span)
            inner = self.index_expr(node.args[0])
            if isinstance(inner, Wrapped):
                self.fail("boundary wrappers cannot be nested", node.args[0].span)
            amounts = [self.int_const(a) for a in node.args[1:]]
            if any(a < 0 for a in amounts):
                self.fail("pad amounts must be non-negative integers", node.args[1].span)
            lo = amounts[0] if amounts else None
            hi = amounts[-1] if amounts else None
            return Wrapped(kind, inner, lo, hi, node.span)
        return self.index_expr(node)

    def int_const(self, node) -> int:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.int_const(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        self.fail("expected an integer constant", node.span)

    def index_expr(self, node):
        """An affine index expression, or a gather plus an affine offset."""
        if isinstance(node, ast.Slice):
            self.fail("slices (':') are not supported in tullio_py indices", node.span,
                      "write an index name instead, e.g. A[i,j]")
        if isinstance(node, ast.Subscript):
            acc = self.access(node)
            for s in acc.indices:
                if not isinstance(s, Affine):
                    self.fail("an index array must be indexed by plain (affine) indices", s.span)
            return Gather(acc.array, acc.indices, Affine(), node.span)
        if isinstance(node, ast.Name):
            self.check_name(node)
            return Affine(((node.id, 1),), 0, node.span)
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                self.fail("indices must be integers", node.span,
                          "floats and strings cannot index an array")
            return Affine((), node.value, node.span)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = self.index_expr(node.operand)
            if isinstance(inner, Gather):
                self.fail("a gather can be shifted but not negated or scaled", node.span)
            return _written(Affine.of(inner.terms, inner.const).scale(
                -1 if isinstance(node.op, ast.USub) else 1), node.span)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            a, b = self.index_expr(node.left), self.index_expr(node.right)
            sign = 1 if isinstance(node.op, ast.Add) else -1
            if isinstance(b, Gather):
                if sign < 0 or isinstance(a, Gather):
                    self.fail("a gather can be shifted but not negated, and only one gather per "
                              "index", node.span)
                a, b = b, a
            if isinstance(a, Gather):
                return Gather(a.array, a.indices, a.offset + b.scale(sign), node.span)
            out = a + b.scale(sign)
            return _written(out, node.span)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            a, b = self.index_expr(node.left), self.index_expr(node.right)
            if isinstance(a, Gather) or isinstance(b, Gather):
                self.fail("a gather can be shifted but not scaled", node.span)
            if a.terms and b.terms:
                self.fail("index expressions must be affine: a product of two indices is not "
                          "allowed", node.span, "use a gather with a precomputed index array")
            k, e = (a.const, b) if not a.terms else (b.const, a)
            out = e.scale(k)
            return _written(out, node.span)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
            self.fail("'^' is not a power in tullio_py", node.span, "use ** for powers")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            self.fail("division and modulo are not allowed in indices: the range of i/2 is "
                      "ambiguous", node.span, "use a stride on the other side, e.g. x[2i] or mod(i)")
        self.fail(f"this is not an index expression: {type(node).__name__} is not allowed in "
                  "brackets", node.span,
                  "indices are affine: i, i+j, 2i+k-1, J[k], pad(i+k, 1, 1), clamp(i), mod(i)")

    # --------------------------------------------------------------- right-hand side
    def expr(self, node):
        if isinstance(node, ast.Constant):
            v = node.value
            if type(v) in (int, float, complex):
                return Const(v)
            self.fail(f"{type(v).__name__} constants are not allowed", node.span)
        if isinstance(node, ast.Name):
            self.check_name(node)
            if node.id in self.index_names:
                return IndexValue(node.id, node.span)
            if node.id in FUNCTIONS:
                self.fail(f"'{node.id}' is a function: call it", node.span)
            return Param(node.id, node.span)
        if isinstance(node, ast.Subscript):
            return self.access(node)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.BitXor):
                self.fail("'^' is not a power in tullio_py", node.span, "use ** for powers")
            if type(node.op) not in _BINOPS:
                self.fail(f"operator {type(node.op).__name__} is not allowed: use + - * / **",
                          node.span)
            return Binary(_BINOPS[type(node.op)], self.expr(node.left), self.expr(node.right))
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                inner = self.expr(node.operand)
                if isinstance(node.op, ast.UAdd):
                    return inner
                if isinstance(inner, Const) and not isinstance(inner.value, complex):
                    return Const(-inner.value)
                return Unary("-", inner)
            self.fail(f"operator {type(node.op).__name__} is not allowed", node.span)
        if isinstance(node, ast.Compare):
            ops = []
            for o in node.ops:
                if type(o) not in _CMPOPS:
                    self.fail("only the comparisons < <= > >= == != are allowed", node.span)
                ops.append(_CMPOPS[type(o)])
            return Compare(tuple(ops), tuple(self.expr(x) for x in [node.left] + node.comparators))
        if isinstance(node, ast.IfExp):
            return Call("where", (self.expr(node.test), self.expr(node.body), self.expr(node.orelse)),
                        node.span)
        if isinstance(node, ast.Call):
            return self.call(node)
        what = {ast.Attribute: "attribute access", ast.Lambda: "lambda", ast.Starred: "starred "
                "arguments", ast.JoinedStr: "strings", ast.BoolOp: "'and'/'or'", ast.List: "lists",
                ast.Tuple: "tuples", ast.Dict: "dicts", ast.NamedExpr: "':='"}.get(type(node))
        self.fail(f"{what or type(node).__name__} not allowed: tullio_py accepts names, numbers, "
                  "indexed arrays, arithmetic, comparisons and its own functions", node.span)

    def call(self, node: ast.Call):
        if not isinstance(node.func, ast.Name):
            self.fail("only tullio_py's own functions can be called", node.func.span,
                      "functions: " + ", ".join(FUNCTIONS))
        f = node.func.id
        if f in BOUNDARY_WRAPPERS:
            self.fail(f"{f}(...) is a boundary rule for an index and belongs inside brackets",
                      node.span, f"e.g. A[{f}(i+k)]")
        if f not in FUNCTIONS:
            self.fail(f"unknown function '{f}'", node.func.span,
                      "functions: " + ", ".join(FUNCTIONS))
        if node.keywords:
            self.fail("keyword arguments are not allowed", node.keywords[0].value.span)
        if any(isinstance(a, ast.Starred) for a in node.args):
            self.fail("starred arguments are not allowed", node.span)
        want = 1 if f in ELEMENTWISE_FUNCS else (2 if f in BINARY_FUNCS else 3)
        if len(node.args) != want:
            self.fail(f"{f}() takes {want} argument{'s' if want > 1 else ''}, "
                      f"got {len(node.args)}", node.span)
        return Call(f, tuple(self.expr(a) for a in node.args), node.span)

    def check_name(self, node: ast.Name):
        if node.id.startswith("_"):
            self.fail("names may not start with '_' (reserved for generated code)", node.span)
        if node.id in FUNCTIONS + BOUNDARY_WRAPPERS and not isinstance(getattr(node, "ctx", None), ast.Load):
            self.fail(f"'{node.id}' is a function name", node.span)

    # --------------------------------------------------------------- statement-level rules
    def check_rules(self, eq: Equation, op_at: int, rhs_span):
        reads_output = any(a.array == eq.output for a in eq.accesses()) or \
            any(isinstance(n, Param) and n.name == eq.output for n in walk(eq.rhs)) or \
            any(g.array == eq.output for g in eq.gathers())
        if eq.assign == ":=" and reads_output:
            self.fail(f"':=' creates a new array, but '{eq.output}' is also read on the right",
                      eq.lhs.span, "use '=' to overwrite an existing array in place")
        if not eq.reduction_indices and (eq.reduction is not None or eq.finaliser):
            what = f"reduction ({eq.reduction})" if eq.reduction is not None else f"finaliser |> {eq.finaliser}"
            self.fail(f"a {what} needs an index to reduce over, but every index appears on the left",
                      self.prefix_span if eq.reduction is not None else self.fin_span)
        if eq.assign in ("+=", "-=") and eq.reduction not in (None, "+"):
            self.fail(f"'{eq.assign}' accumulates a sum; it cannot use the ({eq.reduction}) reduction",
                      (op_at, op_at + 2), "use '=' with the reduction, or drop the prefix")
        if eq.assign == "*=" and eq.reduction not in (None, "*"):
            self.fail(f"'*=' multiplies by a product; it cannot use the ({eq.reduction}) reduction",
                      (op_at, op_at + 2))
        if eq.assign == ":=":
            for s in eq.lhs.indices:
                if isinstance(s, Affine) and not s.terms and s.const != 0:
                    self.fail("a constant index on the left of ':=' must be 0 (a dimension of "
                              "size 1)", s.span, "use '=' to write into one slice of an existing array")
        arrays = {a.array for a in [eq.lhs] + eq.accesses()} | {g.array for g in eq.gathers()}
        for n in walk(eq.rhs):
            if isinstance(n, Param) and n.name in arrays:
                self.fail(f"'{n.name}' is an array and must be indexed", n.span)
        if isinstance(eq.lhs, Access) and eq.lhs.array in self.index_names:
            self.fail(f"'{eq.lhs.array}' is used both as an index and as the output", eq.lhs.span)
