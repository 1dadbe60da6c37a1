# Shared compile settings and helpers for Orion targets.

function(orion_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion)
  if(ORION_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # In a unity build each source is #included into a generated one, so GCC no longer sees a class
  # with a member of a file-local type as defined in the main file and warns (-Wsubobject-linkage)
  # where the separate build does not; the separate build keeps the warning.
  if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
  if(ORION_SANITIZE)
    string(REPLACE ";" "," _san "${ORION_SANITIZE}")
    target_compile_options(${target} PRIVATE -fsanitize=${_san} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

# orion_sanitizer_link(TARGET): a shared library built from sanitized objects elsewhere (an OBJECT
# library's link options do not reach it) links the sanitizer's runtime itself, as --no-undefined
# requires.
function(orion_sanitizer_link target)
  if(ORION_SANITIZE)
    string(REPLACE ";" "," _san "${ORION_SANITIZE}")
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

# orion_library(NAME SOURCES ... DEPS ...): a static library with include/ as its public headers.
function(orion_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${A_DEPS})
  orion_warnings(${name})
endfunction()

# orion_tool(NAME SOURCE DEPS ...): a command-line tool in tools/ (CLI11 for its options).
function(orion_tool name source)
  cmake_parse_arguments(A "" "" "DEPS" ${ARGN})
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${A_DEPS} CLI11::CLI11)
  orion_warnings(${name})
endfunction()

# orion_unit_test(NAME SOURCES ... DEPS ...): a GoogleTest binary registered with ctest (label unit).
function(orion_unit_test name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ORION_BUILD_TESTS)
    return()
  endif()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main Threads::Threads)
  orion_warnings(${name})
  set(_labels unit)
  if(A_LABELS)
    set(_labels ${A_LABELS})
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${_labels}" TIMEOUT 300)
endfunction()
