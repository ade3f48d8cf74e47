"""The tree's CMake targets as check_includes.py needs them, read from the CMakeLists.txt files
(no CMake run): each target's sources, include directories (scope, and where they point: the
whole tree, a source folder, the build tree) and the headers it makes public through
dropless_public_headers() (cmake/dropless_public_headers.cmake).

Only what a plain reading can know: a path made of ${PROJECT_SOURCE_DIR}, ${CMAKE_SOURCE_DIR},
${CMAKE_CURRENT_SOURCE_DIR}, the binary-dir variables, and variables set() in the same file;
anything else (a glob's result, a cache variable) is "unknown" and not judged.
"""
import collections
import os
import posixpath
import re

SKIP_DIRS = ("third_party",)
COMMAND = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"]+')
VARIABLE = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
SCOPES = ("PUBLIC", "PRIVATE", "INTERFACE")
LIBRARY_TYPES = ("STATIC", "SHARED", "MODULE", "INTERFACE", "OBJECT")

Target = collections.namedtuple("Target", "name kind type cmake line sources")
# scope: PUBLIC / PRIVATE / INTERFACE (DIRECTORY for include_directories()); where: "tree" (the
# repository root), "source" (a folder of the source tree, path = its repository path), "build"
# or "unknown".
IncludeDir = collections.namedtuple("IncludeDir", "target scope text where path cmake line")
PublicHeaders = collections.namedtuple("PublicHeaders", "target headers cmake line")


def _strip_comments(text):
    lines = []
    for line in text.split("\n"):
        quoted, cut = False, len(line)
        for i, c in enumerate(line):
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                quoted = not quoted
            elif c == "#" and not quoted:
                cut = i
                break
        lines.append(line[:cut])
    return "\n".join(lines)


def commands(text):
    """(name, argument tokens, line) of every command call, in order."""
    text = _strip_comments(text)
    pos = 0
    while True:
        m = COMMAND.search(text, pos)
        if not m:
            return
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
            i += 1
        args = [t[1:-1] if t.startswith('"') else t for t in TOKEN.findall(text[m.end():i - 1])]
        yield m.group(1), args, text.count("\n", 0, m.start()) + 1
        pos = i


class Resolver:
    """Paths of one CMakeLists.txt, as ("tree" | "source" | "build" | "unknown", repository path)."""

    def __init__(self, cmake_dir):
        self.cmake_dir = cmake_dir  # repository path of the file's folder ("" at the root)
        self.variables = {}

    def substitute(self, token):
        if token.startswith("$<BUILD_INTERFACE:") and token.endswith(">"):
            token = token[len("$<BUILD_INTERFACE:"):-1]
        for _ in range(4):  # variables set from variables
            token = VARIABLE.sub(lambda m: self._value(m.group(1), m.group(0)), token)
        return token

    def _value(self, name, text):
        if name in ("PROJECT_SOURCE_DIR", "CMAKE_SOURCE_DIR"):
            return "@SRC@"
        if name in ("CMAKE_CURRENT_SOURCE_DIR", "CMAKE_CURRENT_LIST_DIR"):
            return "@SRC@/" + self.cmake_dir if self.cmake_dir else "@SRC@"
        if name in ("PROJECT_BINARY_DIR", "CMAKE_BINARY_DIR", "CMAKE_CURRENT_BINARY_DIR"):
            return "@BUILD@"
        return self.variables.get(name, text)

    def path(self, token):
        token = self.substitute(token)
        if token.startswith("@BUILD@"):
            return "build", None
        if "${" in token or "$<" in token or "@BUILD@" in token:
            return "unknown", None
        if token.startswith("@SRC@"):
            rel = token[len("@SRC@"):].lstrip("/")
        elif token.startswith("/"):
            return "unknown", None
        else:
            rel = posixpath.join(self.cmake_dir, token)
        rel = posixpath.normpath(rel) if rel else "."
        if rel == ".":
            return "tree", ""
        if rel.startswith(".."):
            return "unknown", None
        return "source", rel


class Model:
    """Every target, include directory and public-header list of the tree's CMakeLists.txt."""

    def __init__(self, source_dir):
        self.source_dir = source_dir
        self.targets = {}
        self.include_dirs = []
        self.public_headers = []
        for root, dirs, files in os.walk(source_dir):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.startswith("build")
                             and d not in SKIP_DIRS)
            if "CMakeLists.txt" in files:
                self._read(os.path.join(root, "CMakeLists.txt"))
        # header -> target that makes it public; source file -> targets it is compiled into
        self.public = {}
        for entry in self.public_headers:
            for header in entry.headers:
                self.public.setdefault(header, entry.target)
        self.compiled_in = collections.defaultdict(set)
        for target in self.targets.values():
            for source in target.sources:
                self.compiled_in[source].add(target.name)

    def _read(self, path):
        cmake = os.path.relpath(path, self.source_dir).replace(os.sep, "/")
        resolver = Resolver(posixpath.dirname(cmake))
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, args, line in commands(text):
            name = name.lower()
            if name == "set" and args:
                if "CACHE" in args:  # the user's to set: not known here
                    resolver.variables.pop(args[0], None)
                else:
                    resolver.variables[args[0]] = " ".join(
                        resolver.substitute(a) for a in args[1:] if a != "PARENT_SCOPE")
            elif name in ("add_library", "add_executable") and args:
                self._add_target(name, args, cmake, line, resolver)
            elif name == "target_sources" and args and args[0] in self.targets:
                self.targets[args[0]].sources.extend(self._sources(args[1:], resolver))
            elif name == "target_include_directories" and args:
                self._add_include_dirs(args[0], args[1:], cmake, line, resolver, None)
            elif name == "include_directories":
                self._add_include_dirs(None, args, cmake, line, resolver, "DIRECTORY")
            elif name == "dropless_public_headers" and args:
                prefix = posixpath.dirname(cmake)
                headers = [posixpath.normpath(posixpath.join(prefix, resolver.substitute(h)))
                           for h in args[1:]]
                self.public_headers.append(PublicHeaders(args[0], headers, cmake, line))

    def _add_target(self, command, args, cmake, line, resolver):
        rest = args[1:]
        if any(word in ("IMPORTED", "ALIAS") for word in rest[:2]):
            return
        kind = "library" if command == "add_library" else "executable"
        type_ = rest[0] if rest and rest[0] in LIBRARY_TYPES else ("STATIC" if kind == "library"
                                                                   else "EXECUTABLE")
        self.targets[args[0]] = Target(args[0], kind, type_, cmake, line,
                                       self._sources(rest, resolver))

    @staticmethod
    def _sources(tokens, resolver):
        sources = []
        for token in tokens:
            if token in LIBRARY_TYPES + SCOPES + ("EXCLUDE_FROM_ALL", "WIN32", "MACOSX_BUNDLE"):
                continue
            where, rel = resolver.path(token)
            if where == "source":
                sources.append(rel)
        return sources

    def _add_include_dirs(self, target, tokens, cmake, line, resolver, scope):
        for token in tokens:
            if token in SCOPES:
                scope = token
                continue
            if token in ("SYSTEM", "BEFORE", "AFTER"):
                continue
            where, rel = resolver.path(token)
            self.include_dirs.append(IncludeDir(target, scope or "DIRECTORY", token, where, rel,
                                                cmake, line))

    def owners(self, path):
        """Targets a file of the tree belongs to: those it is compiled into; for a header, those
        that compile its .cc/.cu (same folder and name), else those with sources in its folder,
        else anywhere under the nearest folder above that has some (header-only code)."""
        if path in self.compiled_in:
            return self.compiled_in[path]
        stem = posixpath.splitext(path)[0]
        found = set()
        for ext in (".cc", ".cu", ".cpp", ".c"):
            found |= self.compiled_in.get(stem + ext, set())
        if found:
            return found
        folder = posixpath.dirname(path)
        found = {t for source, targets in self.compiled_in.items()
                 if posixpath.dirname(source) == folder for t in targets}
        while folder and not found:
            found = {t for source, targets in self.compiled_in.items()
                     if source.startswith(folder + "/") for t in targets}
            folder = posixpath.dirname(folder)
        return found
