# One helper per kind of target, so that adding a file is one line.

set(GPUCOMPUTE_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# gc_add_library(name SOURCES ... DEPS ...): a C++ library of ours.
function(gc_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PUBLIC_INCLUDES" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GPUCOMPUTE_WARNINGS}>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${ARG_PUBLIC_INCLUDES})
endfunction()

# gc_cuda_options(target): our nvcc flags for device code.
function(gc_cuda_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall,-Wno-unused-parameter>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()

# gc_add_test(name SOURCES ... DEPS ... [LABELS ...]): a GoogleTest binary registered with ctest.
function(gc_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GPUCOMPUTE_WARNINGS}>)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  include(GoogleTest)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${ARG_LABELS}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
