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
- a library's private headers are its own: every header of common/, coordinator/, worker/ and
  cli/ that no dropless_public_headers() call of the CMakeLists.txt files lists is included only
  by the targets that compile it (its .cc, or code in its folder: cmake_targets.Model.owners);
  common/'s parser internals only from common/; the kernels' implementation (kernels/cpu/,
  kernels/cuda/) only from kernels/ and bench/ (which measures the kernels themselves), everything
  else uses their contracts, "dropless/kernels/*.h" (KNOWN_PRIVATE_INCLUDES lists the exceptions
  still to be removed). Tests are held to it too, but for the sources of the white-box targets in
  WHOLE_TREE_PRIVATE.

And the CMake side of the same rule (--cmake), on every target of the tree (cmake_targets.py reads
the CMakeLists.txt files):
- no PUBLIC or INTERFACE include directory (nor a folder-wide include_directories()) names the
  whole tree or a source folder of code: a library exposes its public headers through
  dropless_public_headers() (links in the build tree), or a contracts folder named include/;
- ${PROJECT_SOURCE_DIR} as a PRIVATE include directory only for a library's own sources (libraries
  of PRODUCTION_DIRS) and for the few targets in WHOLE_TREE_PRIVATE, each with its reason;
- every library of common/, coordinator/, worker/ and cli/ lists its public headers; each listed
  header exists, is listed once, and includes only public headers (a consumer compiles it through
  the same folder of links); PUBLIC_HEADER_LIBRARIES and KERNEL_LIBRARIES must all be found.

An include names an area by its path from the repository root ("worker/engine/engine.h"), or, for
the kernels' public headers, "dropless/kernels/..."; "kernels/..." is the kernels too.

And one log facility: the coordinator's and the worker daemon's code (not their main.cc, which may
print usage errors) writes to stderr only through common/log.h (LogInfo / LogWarning / LogError).

Usage: check_includes.py --source-dir DIR [--self-test | --logging | --cmake]
  --logging    check the log rule instead of the include rules
  --cmake      check the targets' include directories and public headers instead of the include rules
  --self-test  writes a few violating files into a temporary tree and checks that each is reported
               (and that the allowed ones are not)
"""
import argparse
import os
import posixpath
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cmake_targets  # noqa: E402

SOURCE_DIRS = ("coordinator", "worker", "cli", "kernels", "common", "bench", "tests")
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


# Folders whose headers are private unless a dropless_public_headers() call lists them.
GUARDED_DIRS = ("common/", "coordinator/", "worker/", "cli/")
HEADER_EXTENSIONS = (".h", ".hpp", ".cuh")
# Targets that see the whole tree (a PRIVATE ${PROJECT_SOURCE_DIR}) though they are no library of
# PRODUCTION_DIRS: the tests of a library's internals and the benchmarks. Keep it short; each says
# why, as its CMakeLists.txt does. Their sources may include private headers.
WHOLE_TREE_PRIVATE = {
    "kernels_cpu_test": "kernel_choice_test.cc checks the grouped GEMM's kernel choice "
                        "(kernels/cuda/grouped_gemm/kernel_choice.h, host code)",
    "grouped_gemm_test": "checks the grouped GEMM's runners and kernel choice "
                         "(kernels/cuda/grouped_gemm/) and the launch checks (cuda_check.h)",
    "dropless-bench": "measures the kernels' internals; includes its own bench/ headers",
}


def area_path(include):
    """The include as a repository path ("dropless/kernels/x.h" -> "kernels/x.h")."""
    if include.startswith("dropless/kernels/"):
        return "kernels/" + include[len("dropless/kernels/"):]
    return include


def white_box(model, rel):
    return any(t in WHOLE_TREE_PRIVATE for t in model.compiled_in.get(rel, ()))


def private_header(model, source_dir, include):
    """Whether include names a header of GUARDED_DIRS that no library makes public."""
    return include.startswith(GUARDED_DIRS) and include.endswith(HEADER_EXTENSIONS) and \
        include not in model.public and os.path.isfile(os.path.join(source_dir, include))


def violations(source_dir, model=None, model_dir=None):
    """Include rules on the files of source_dir; the CMake model (public headers, which target
    compiles what) is read from model_dir (default: source_dir itself)."""
    model_dir = model_dir or source_dir
    model = model or cmake_targets.Model(model_dir)
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
                    found.extend("%s:%d: includes %s: %s" % (rel, text.count("\n", 0, m.start()) + 1,
                                                            m.group(1), why)
                                 for why in include_problems(model, model_dir, rel, m.group(1)))
    return found


def include_problems(model, model_dir, rel, include):
    """Why file rel may not include `include` (empty when it may)."""
    target = area_path(include)
    problems = []
    for folder, forbidden, why in RULES:
        if rel.startswith(folder) and any(target.startswith(prefix) for prefix in forbidden):
            problems.append(why)
    if white_box(model, rel):
        return problems
    for header, owners, why in PRIVATE_HEADERS:
        if target.startswith(header) and not any(rel.startswith(o) for o in owners) and \
                not any(rel.startswith(f) and target == h for f, h in KNOWN_PRIVATE_INCLUDES):
            problems.append(why)
    if private_header(model, model_dir, target):
        owners = model.owners(target)
        if not owners & model.owners(rel):
            problems.append("private to %s (no dropless_public_headers() lists it): use its public "
                            "headers, or make it public there"
                            % (", ".join(sorted(owners)) or "the target that compiles it"))
    if rel.startswith(ENGINE) and target.startswith(TRANSPORT) and \
            target not in ENGINE_TRANSPORT_ALLOWED:
        problems.append("the engine reaches other ranks only through %s"
                        % ", ".join(sorted(ENGINE_TRANSPORT_ALLOWED)))
    return problems


# The libraries whose folders PRIVATE ${PROJECT_SOURCE_DIR} may serve (their own sources).
PRODUCTION_DIRS = ("common/", "coordinator/", "worker/", "cli/", "kernels/", "proto/")
# Found with their public headers listed, or the checker is reading less than it should.
PUBLIC_HEADER_LIBRARIES = (
    "dropless_base", "dropless_common", "dropless_grpc_security", "dropless_coordinator_lib",
    "dropless_engine_interface", "dropless_engine_model", "dropless_engine_cpu",
    "dropless_engine_registry", "dropless_engine_cuda_core", "dropless_engine_checkpoint",
    "dropless_step_report", "dropless_worker_daemon", "dropless_worker_rank",
    "dropless_transport_interfaces", "dropless_transport", "dropless_cli_lib")
# Their PUBLIC include directory is the kernels' contracts folder, kernels/include.
KERNEL_LIBRARIES = ("dropless_kernels_cpu", "dropless_kernels_cuda", "dropless_grouped_gemm")


def cmake_violations(source_dir, model=None):
    model = model or cmake_targets.Model(source_dir)
    found = []

    def report(cmake, line, target, text):
        found.append("%s:%d: %s: %s" % (cmake, line, target or "include_directories()", text))

    for d in model.include_dirs:
        if d.scope == "PRIVATE":
            target = model.targets.get(d.target)
            own = target is not None and target.kind == "library" and \
                target.cmake.startswith(PRODUCTION_DIRS)
            if d.where == "tree" and not own and d.target not in WHOLE_TREE_PRIVATE:
                report(d.cmake, d.line, d.target,
                       "sees the whole tree (PRIVATE %s): link the libraries whose public headers "
                       "it includes (dropless_test_includes for tests/ helpers), or, for a test of "
                       "a library's internals, list it in WHOLE_TREE_PRIVATE with the reason"
                       % d.text)
            continue
        scope = "visible to every target of its folder" if d.scope == "DIRECTORY" else d.scope
        if d.where == "tree":
            report(d.cmake, d.line, d.target, "makes the whole tree %s (%s): expose the public "
                   "headers only, with dropless_public_headers()" % (scope, d.text))
        elif d.where == "source" and posixpath.basename(d.path) != "include":
            report(d.cmake, d.line, d.target, "makes the source folder %s/ %s: every header in "
                   "it becomes public; list the public ones with dropless_public_headers()"
                   % (d.path, scope))

    listed = {}
    for entry in model.public_headers:
        if entry.target not in model.targets:
            report(entry.cmake, entry.line, entry.target, "no such target")
        for header in entry.headers:
            if not os.path.isfile(os.path.join(source_dir, header)):
                report(entry.cmake, entry.line, entry.target, "public header %s does not exist"
                       % header)
                continue
            if header in listed and listed[header] != entry.target:
                report(entry.cmake, entry.line, entry.target, "%s is public in %s already: list "
                       "a header once" % (header, listed[header]))
            listed.setdefault(header, entry.target)
            with open(os.path.join(source_dir, header), encoding="utf-8", errors="replace") as f:
                for include in INCLUDE.findall(f.read()):
                    if private_header(model, source_dir, include) or (
                            include.startswith(("kernels/cpu/", "kernels/cuda/")) and
                            os.path.isfile(os.path.join(source_dir, include))):
                        report(entry.cmake, entry.line, entry.target,
                               "public header %s includes %s, which is not public: its "
                               "consumers cannot compile it" % (header, include))
    with_headers = {e.target for e in model.public_headers}
    for target in model.targets.values():
        if target.kind == "library" and target.type in ("STATIC", "INTERFACE", "OBJECT") and \
                target.cmake.startswith(GUARDED_DIRS) and target.name not in with_headers:
            report(target.cmake, target.line, target.name, "lists no public headers: call "
                   "dropless_public_headers() (cmake/dropless_public_headers.cmake)")
    return found, with_headers


def missing_libraries(model, with_headers):
    """Libraries that must be found and are not: a renamed target would pass unchecked."""
    found = ["%s: no dropless_public_headers() call found" % t
             for t in PUBLIC_HEADER_LIBRARIES if t not in with_headers]
    for target in KERNEL_LIBRARIES:
        if not any(d.target == target and d.scope == "PUBLIC" and d.path == "kernels/include"
                   for d in model.include_dirs):
            found.append("%s: its PUBLIC include directory kernels/include was not found" % target)
    return found


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


def self_test(source_dir):
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
        # Private headers of the libraries, by the real tree's dropless_public_headers() lists.
        "worker/daemon/z.cc": '#include "worker/rank/phase_reporter.h"\n',
        "tests/unit/worker/z.cc": '#include "worker/daemon/coordinator_session.h"\n',
        "bench/z.cc": '#include "worker/engine/cuda/rank_model.h"\n',
        "tests/unit/common/z.cc": '#include "kernels/cpu/routing_impl.h"\n',
    }
    good = {
        "worker/engine/cpu/y.cc": '#include "worker/transport/communicator.h"\n',
        "worker/daemon/y.cc": '#include "worker/rank/step_report.h"\n#include "dropless/v1/types.pb.h"\n',
        "kernels/cpu/y.cc": '#include "dropless/kernels/routing.h"\n',
        "common/job_spec_yaml.cc": '#include "common/yaml_tree.h"\n#include "common/job_spec_internal.h"\n',
        "bench/y.cu": '#include "kernels/cuda/hopper/bulk_copy.cuh"\n',
        "worker/engine/cuda/y.cc": '#include "kernels/cuda/cuda_check.h"\n',
        "worker/rank/rank_process.cc": '#include "worker/rank/phase_reporter.h"\n',
        "tests/unit/kernels/kernel_choice_test.cc":
            '#include "kernels/cuda/grouped_gemm/kernel_choice.h"\n',
        "tests/unit/worker/y.cc": '#include "worker/daemon/worker_daemon.h"\n',
    }
    failures = 0
    model = cmake_targets.Model(source_dir)
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
        found = violations(tmp, model=model, model_dir=source_dir)
        for rel in bad:
            if not any(v.startswith(rel + ":1:") for v in found):
                print("FAIL: self-test: %s was not reported" % rel)
                failures += 1
        for rel in good:
            for v in found:
                if v.startswith(rel + ":"):
                    print("FAIL: self-test: allowed include reported: %s" % v)
                    failures += 1
    failures += cmake_self_test()
    print("self-test: %d violating files, %d clean ones, %d failures" % (len(bad), len(good), failures))
    return failures


# Planted CMakeLists.txt files: (file, target, a word of the expected report) for each violation;
# nothing else may be reported.
CMAKE_PLANTED = {
    "worker/CMakeLists.txt": """add_library(dropless_x STATIC x.cc)
dropless_public_headers(dropless_x x.h missing.h)
target_include_directories(dropless_x PRIVATE ${PROJECT_SOURCE_DIR})
add_library(dropless_y STATIC y.cc)
target_include_directories(dropless_y PUBLIC ${PROJECT_SOURCE_DIR})
add_library(dropless_z INTERFACE)
target_include_directories(dropless_z INTERFACE ${CMAKE_CURRENT_SOURCE_DIR})  # worker/
dropless_public_headers(dropless_z x.h)
""",
    "worker/x.h": '#include "worker/y.h"\n',
    "worker/y.h": "",
    "tests/CMakeLists.txt": """add_executable(some_test t.cc)
target_include_directories(some_test PRIVATE ${PROJECT_SOURCE_DIR})
add_executable(kernels_cpu_test t.cc)
target_include_directories(kernels_cpu_test PRIVATE ${PROJECT_SOURCE_DIR})
add_library(test_helpers INTERFACE)
target_include_directories(test_helpers INTERFACE ${CMAKE_CURRENT_BINARY_DIR}/include)
include_directories(${PROJECT_SOURCE_DIR}/tests/..)
""",
    "kernels/CMakeLists.txt": """add_library(dropless_kernels_cpu STATIC a.cc)
target_include_directories(dropless_kernels_cpu
  PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include PRIVATE ${PROJECT_SOURCE_DIR})
set(whole ${PROJECT_SOURCE_DIR})
target_include_directories(dropless_kernels_cuda PUBLIC "${whole}")
""",
}
CMAKE_EXPECTED = [
    ("worker/CMakeLists.txt", "dropless_x", "missing.h does not exist"),
    ("worker/CMakeLists.txt", "dropless_x", "includes worker/y.h"),
    ("worker/CMakeLists.txt", "dropless_y", "whole tree PUBLIC"),
    ("worker/CMakeLists.txt", "dropless_y", "lists no public headers"),
    ("worker/CMakeLists.txt", "dropless_z", "source folder worker/"),
    ("worker/CMakeLists.txt", "dropless_z", "public in dropless_x already"),
    ("worker/CMakeLists.txt", "dropless_z", "includes worker/y.h"),
    ("tests/CMakeLists.txt", "some_test", "sees the whole tree"),
    ("tests/CMakeLists.txt", "include_directories()", "whole tree visible to every target"),
    ("kernels/CMakeLists.txt", "dropless_kernels_cuda", "whole tree PUBLIC"),
]


def cmake_self_test():
    failures = 0
    with tempfile.TemporaryDirectory(prefix="dropless-cmake-") as tmp:
        for rel, text in CMAKE_PLANTED.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as f:
                f.write(text)
        found, _ = cmake_violations(tmp)
    for cmake, target, words in CMAKE_EXPECTED:
        if not any(v.startswith(cmake + ":") and (": %s: " % target) in v and words in v
                   for v in found):
            print("FAIL: self-test: --cmake did not report %s %s (%s)" % (cmake, target, words))
            failures += 1
    if len(found) != len(CMAKE_EXPECTED):
        print("FAIL: self-test: --cmake reported %d, want %d:\n  %s"
              % (len(found), len(CMAKE_EXPECTED), "\n  ".join(found)))
        failures += 1
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--logging", action="store_true")
    parser.add_argument("--cmake", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return 1 if self_test(args.source_dir) else 0
    if args.cmake:
        model = cmake_targets.Model(args.source_dir)
        found, with_headers = cmake_violations(args.source_dir, model)
        found += missing_libraries(model, with_headers)
        for v in found:
            print("FAIL:", v)
        print("%d target(s) checked, %d librar(y/ies) listing public headers: %d problem(s)"
              % (len(model.targets), len(with_headers), len(found)))
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
