#!/usr/bin/env python3
"""The dependency rules of docs/architecture.md, checked on every #include of the tree:

- the control plane (coordinator/, worker/daemon/, cli/) includes nothing from worker/engine/,
  worker/transport/ or the kernels: it knows no GPU and links no CUDA;
- the CLI reaches the coordinator only through the API: nothing from coordinator/ or worker/;
- the coordinator includes nothing from worker/ or cli/; the worker daemon nothing from
  coordinator/ or cli/ (they talk over proto/dropless/v1);
- the kernels include nothing above them (no common/, worker/, coordinator/, cli/, bench/, API);
- the engine reaches other ranks only through the transport's interfaces (Communicator,
  worker/transport/communicator.h, and the rendezvous KeyValueStore, kv_store.h), never a backend;
- common/ (the job spec, shared by all of them) includes only common/;
- a library's private headers are its own: common/'s parser internals (PRIVATE_HEADERS) only from
  common/, and the kernels' implementation (kernels/cpu/, kernels/cuda/) only from kernels/ and
  bench/ (which measures the kernels themselves); everything else uses their contracts,
  "dropless/kernels/*.h" (KNOWN_PRIVATE_INCLUDES lists the exceptions still to be removed).

And the CMake side of the same rule (--cmake): the libraries in PUBLIC_INCLUDE_ONLY expose only their
public headers, so their PUBLIC include directories never name the whole tree (${PROJECT_SOURCE_DIR}).

An include names an area by its path from the repository root ("worker/engine/engine.h"), or, for
the kernels' public headers, "dropless/kernels/..."; "kernels/..." is the kernels too.

And one log facility: the coordinator's and the worker daemon's code (not their main.cc, which may
print usage errors) writes to stderr only through common/log.h (LogInfo / LogWarning / LogError).

Usage: check_includes.py --source-dir DIR [--self-test | --logging | --cmake]
  --logging    check the log rule instead of the include rules
  --cmake      check the libraries' PUBLIC include directories instead of the include rules
  --self-test  writes a few violating files into a temporary tree and checks that each is reported
               (and that the allowed ones are not)
"""
import argparse
import os
import re
import sys
import tempfile

SOURCE_DIRS = ("coordinator", "worker", "cli", "kernels", "common", "bench")
EXTENSIONS = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)

ENGINE, TRANSPORT, KERNELS = "worker/engine/", "worker/transport/", "kernels/"
# (files under this folder, forbidden include prefixes, why)
RULES = [
    ("coordinator/", [ENGINE, TRANSPORT, KERNELS, "worker/", "cli/"],
     "the coordinator is control plane: no engine, transport, kernels, worker or CLI code"),
    ("worker/daemon/", [ENGINE, TRANSPORT, KERNELS, "coordinator/", "cli/"],
     "the worker daemon links no engine, transport or CUDA, and talks to the coordinator over the API"),
    ("cli/", [ENGINE, TRANSPORT, KERNELS, "worker/", "coordinator/"],
     "the CLI reaches the coordinator only through the API"),
    ("kernels/", ["common/", "worker/", "coordinator/", "cli/", "bench/", "dropless/v1/"],
     "the kernels include nothing above them"),
    ("common/", [ENGINE, TRANSPORT, KERNELS, "worker/", "coordinator/", "cli/", "bench/"],
     "common/ is shared by every binary and depends on none of them"),
]
# The engine may include the transport's interfaces, nothing else of it: the Communicator, and the
# KeyValueStore of the attempt's rendezvous (the CUDA engine's NCCL group exchanges its unique id
# through it).
ENGINE_TRANSPORT_ALLOWED = {"worker/transport/communicator.h", "worker/transport/kv_store.h"}

# Headers private to a library: (header prefix, folders that may include it, why).
PRIVATE_HEADERS = [
    ("common/job_spec_internal.h", ["common/"], "the job spec's internals are common/'s own"),
    ("common/yaml_tree.h", ["common/"], "the job spec is parsed in common/ and nowhere else"),
    ("kernels/cpu/", ["kernels/", "bench/"],
     "outside the kernels, use their contracts (dropless/kernels/*.h)"),
    ("kernels/cuda/", ["kernels/", "bench/"],
     "outside the kernels, use their contracts (dropless/kernels/*.h)"),
]
# Private includes that exist today and are to be removed by their folder's owner:
# (including folder, header).
KNOWN_PRIVATE_INCLUDES = {
    # The CUDA engine's error check; to move to dropless/kernels/ with the engine's next change.
    ("worker/engine/cuda/", "kernels/cuda/cuda_check.h"),
}


def area_path(include):
    """The include as a repository path ("dropless/kernels/x.h" -> "kernels/x.h")."""
    if include.startswith("dropless/kernels/"):
        return "kernels/" + include[len("dropless/kernels/"):]
    return include


def violations(source_dir):
    found = []
    for top in SOURCE_DIRS:
        for root, dirs, files in os.walk(os.path.join(source_dir, top)):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in sorted(files):
                if not name.endswith(EXTENSIONS):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, source_dir).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = area_path(m.group(1))
                    line = text.count("\n", 0, m.start()) + 1
                    for folder, forbidden, why in RULES:
                        if rel.startswith(folder):
                            for prefix in forbidden:
                                if target.startswith(prefix):
                                    found.append("%s:%d: includes %s: %s" % (rel, line, m.group(1), why))
                                    break
                    for header, owners, why in PRIVATE_HEADERS:
                        if target.startswith(header) and \
                                not any(rel.startswith(o) for o in owners) and \
                                not any(rel.startswith(f) and target == h
                                        for f, h in KNOWN_PRIVATE_INCLUDES):
                            found.append("%s:%d: includes %s: %s" % (rel, line, m.group(1), why))
                    if rel.startswith(ENGINE) and target.startswith(TRANSPORT) and \
                            target not in ENGINE_TRANSPORT_ALLOWED:
                        found.append("%s:%d: includes %s: the engine reaches other ranks only through %s"
                                     % (rel, line, m.group(1), ", ".join(sorted(ENGINE_TRANSPORT_ALLOWED))))
    return found


# Libraries whose PUBLIC include directories hold their public headers only (not the whole tree).
PUBLIC_INCLUDE_ONLY = ("dropless_base", "dropless_common", "dropless_kernels_cpu",
                       "dropless_kernels_cuda", "dropless_grouped_gemm")
TARGET_INCLUDES = re.compile(r"target_include_directories\(\s*([A-Za-z0-9_]+)([^)]*)\)", re.S)
WHOLE_TREE = ("${PROJECT_SOURCE_DIR}", "${CMAKE_SOURCE_DIR}")


def public_include_dirs(cmake_text):
    """target -> the directories its target_include_directories calls make PUBLIC or INTERFACE."""
    dirs = {}
    for m in TARGET_INCLUDES.finditer(cmake_text):
        dirs.setdefault(m.group(1), [])  # seen, whatever its scopes (dropless_public_headers)
        scope = None
        for word in m.group(2).split():
            if word in ("PUBLIC", "PRIVATE", "INTERFACE", "SYSTEM", "BEFORE", "AFTER"):
                if word in ("PUBLIC", "PRIVATE", "INTERFACE"):
                    scope = word
                continue
            if scope in ("PUBLIC", "INTERFACE"):
                dirs.setdefault(m.group(1), []).append(word)
    return dirs


def cmake_violations(source_dir):
    found, seen = [], set()
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "third_party")]
        if "CMakeLists.txt" not in files:
            continue
        path = os.path.join(root, "CMakeLists.txt")
        rel = os.path.relpath(path, source_dir).replace(os.sep, "/")
        with open(path, encoding="utf-8", errors="replace") as f:
            for target, public in public_include_dirs(f.read()).items():
                if target not in PUBLIC_INCLUDE_ONLY:
                    continue
                seen.add(target)
                for d in public:
                    if d.rstrip("/") in WHOLE_TREE:
                        found.append("%s: %s makes %s PUBLIC: expose its public headers only"
                                     % (rel, target, d))
    return found, seen


# Writing to stderr other than through common/log.h.
DIRECT_STDERR = re.compile(r"std::cerr|fprintf\s*\(\s*stderr|fputs\s*\([^;]*stderr|STDERR_FILENO")
LOGGED_DIRS = ("coordinator/", "worker/daemon/")


def direct_stderr(source_dir):
    found = []
    for top in LOGGED_DIRS:
        for root, _, files in os.walk(os.path.join(source_dir, top)):
            for name in sorted(files):
                if not name.endswith(EXTENSIONS) or name == "main.cc":
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, source_dir).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if DIRECT_STDERR.search(line.split("//")[0]):
                            found.append("%s:%d: writes to stderr itself; log through common/log.h "
                                         "(LogInfo / LogWarning / LogError)" % (rel, number))
    return found


def self_test():
    bad = {
        "coordinator/x.cc": '#include "worker/engine/engine.h"\n',
        "worker/daemon/x.cc": '#include "dropless/kernels/routing.h"\n',
        "cli/x.cc": '#include "coordinator/store/job_store.h"\n',
        "kernels/cpu/x.cc": '#include "common/job_spec.h"\n',
        "worker/engine/cpu/x.cc": '#include "worker/transport/gloo_communicator.h"\n',
        "common/x.cc": '#  include <worker/rank/step_report.h>\n',
        "cli/y.cc": '#include "common/yaml_tree.h"\n',
        "worker/engine/cpu/z.cc": '#include "kernels/cuda/cuda_check.h"\n',
        "coordinator/z.cc": '#include "common/job_spec_internal.h"\n',
    }
    good = {
        "worker/engine/cpu/y.cc": '#include "worker/transport/communicator.h"\n',
        "worker/daemon/y.cc": '#include "worker/rank/step_report.h"\n#include "dropless/v1/types.pb.h"\n',
        "kernels/cpu/y.cc": '#include "dropless/kernels/routing.h"\n',
        "common/y.cc": '#include "common/yaml_tree.h"\n#include "common/job_spec_internal.h"\n',
        "bench/y.cu": '#include "kernels/cuda/bulk_copy.cuh"\n',
        "worker/engine/cuda/y.cc": '#include "kernels/cuda/cuda_check.h"\n',
    }
    failures = 0
    with tempfile.TemporaryDirectory(prefix="dropless-includes-") as tmp:
        for rel, text in list(bad.items()) + list(good.items()):
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        with open(os.path.join(tmp, "coordinator/log_here.cc"), "w") as f:
            f.write('void F() { std::fprintf(stderr, "x"); }\n')
        if not any(v.startswith("coordinator/log_here.cc:1:") for v in direct_stderr(tmp)):
            print("FAIL: self-test: a direct write to stderr was not reported")
            failures += 1
        with open(os.path.join(tmp, "CMakeLists.txt"), "w") as f:
            f.write("target_include_directories(dropless_common PUBLIC ${PROJECT_SOURCE_DIR})\n"
                    "target_include_directories(dropless_kernels_cpu\n"
                    "  PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR})\n"
                    "target_include_directories(dropless_cli_lib PUBLIC ${PROJECT_SOURCE_DIR})\n")
        cmake_found, _ = cmake_violations(tmp)
        if [v.split(":")[1].split()[0] for v in cmake_found] != ["dropless_common"]:
            print("FAIL: self-test: --cmake reported %s, want dropless_common only" % cmake_found)
            failures += 1
        found = violations(tmp)
        for rel in bad:
            if not any(v.startswith(rel + ":1:") for v in found):
                print("FAIL: self-test: %s was not reported" % rel)
                failures += 1
        for rel in good:
            for v in found:
                if v.startswith(rel + ":"):
                    print("FAIL: self-test: allowed include reported: %s" % v)
                    failures += 1
    print("self-test: %d violating files, %d clean ones, %d failures" % (len(bad), len(good), failures))
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--logging", action="store_true")
    parser.add_argument("--cmake", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return 1 if self_test() else 0
    if args.cmake:
        found, seen = cmake_violations(args.source_dir)
        # Every listed library must be found, or a renamed target would pass unchecked.
        for target in PUBLIC_INCLUDE_ONLY:
            if target not in seen:
                found.append("%s: no target_include_directories call found" % target)
        for v in found:
            print("FAIL:", v)
        print("%d librar(y/ies) exposing more than their public headers" % len(found))
        return 1 if found else 0
    found = direct_stderr(args.source_dir) if args.logging else violations(args.source_dir)
    for v in found:
        print("FAIL:", v)
    if args.logging:
        print("%d direct write(s) to stderr in %s" % (len(found), ", ".join(LOGGED_DIRS)))
    else:
        print("%d include(s) across a forbidden boundary" % len(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
