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

# gc_add_fuzzer(name SOURCES ... DEPS ...): a libFuzzer target (clang; the
# fuzz preset compiles everything with -fsanitize=fuzzer-no-link and the
# sanitizers, this links the fuzzer's main).
function(gc_add_fuzzer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${GPUCOMPUTE_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
endfunction()

# gc_add_proto_library(name ROOT dir PROTO file): the C++ messages and gRPC
# stubs of one .proto (a path relative to ROOT, which is also the import root)
# as a static library; its headers are included by that relative path, e.g.
# "gpucompute/v1/compute.grpc.pb.h". REQUIRES: find_package(Protobuf) and
# find_package(gRPC) in the calling directory.
function(gc_add_proto_library name)
  cmake_parse_arguments(ARG "" "ROOT;PROTO" "" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${name}_gen)
  string(REGEX REPLACE "\\.proto$" "" stem ${ARG_PROTO})
  set(gen ${out}/${stem}.pb.cc ${out}/${stem}.pb.h ${out}/${stem}.grpc.pb.cc ${out}/${stem}.grpc.pb.h)
  add_custom_command(
    OUTPUT ${gen}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${out}
    COMMAND protobuf::protoc
    ARGS --proto_path=${ARG_ROOT} --cpp_out=${out} --grpc_out=${out}
         --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${ARG_ROOT}/${ARG_PROTO}
    DEPENDS ${ARG_ROOT}/${ARG_PROTO}
    COMMENT "Generating C++ code from ${ARG_PROTO}")
  add_library(${name} STATIC ${gen})
  target_include_directories(${name} PUBLIC ${out})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf gRPC::grpc++)
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
