# dropless_public_headers(<target> <header>...)
#
# A library's consumers see its public headers and nothing else of the tree: each header (a path
# from the calling CMakeLists.txt's folder) is linked into a folder of the build tree that belongs
# to <target> alone, build/public/<target>/, at its path from the repository root, and that folder
# becomes the target's PUBLIC include directory (INTERFACE for an interface library). So a
# consumer's `#include "worker/transport/communicator.h"` resolves as before, and an include of a
# header left off the list fails to compile. The library's own sources see the whole tree through
# their PRIVATE ${PROJECT_SOURCE_DIR}; tests/unit/architecture/check_includes.py holds them to
# the other libraries' public headers.
#
# A public header's own #includes of the library's headers must be public too (the checker
# checks it): a consumer compiles them through the same folder. One call per target: the folder
# is made anew on every configure, so a header taken off the list disappears from it.
function(dropless_public_headers target)
  get_target_property(listed ${target} DROPLESS_PUBLIC_HEADERS)
  if(listed)
    message(FATAL_ERROR "dropless_public_headers(${target}) called twice: list every header once")
  endif()
  set(public_dir ${CMAKE_BINARY_DIR}/public/${target})
  file(REMOVE_RECURSE ${public_dir})
  file(MAKE_DIRECTORY ${public_dir})
  file(RELATIVE_PATH source_prefix ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(headers)
  foreach(header ${ARGN})
    set(source ${CMAKE_CURRENT_SOURCE_DIR}/${header})
    if(NOT EXISTS ${source})
      message(FATAL_ERROR "dropless_public_headers(${target}): ${source} does not exist")
    endif()
    if(source_prefix)
      set(path ${source_prefix}/${header})
    else()
      set(path ${header})
    endif()
    get_filename_component(link_dir ${public_dir}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${link_dir})
    file(CREATE_LINK ${source} ${public_dir}/${path} SYMBOLIC)
    list(APPEND headers ${path})
  endforeach()
  set_target_properties(${target} PROPERTIES DROPLESS_PUBLIC_HEADERS "${headers}")
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${public_dir})
  else()
    target_include_directories(${target} PUBLIC ${public_dir})
  endif()
endfunction()
