# Writes server/metrics/build_info.cc from its template at build time (cmake -P):
# the git revision of SOURCE_DIR ("-dirty" with local changes), or REVISION
# when given (a build outside git, such as a container's), or "unknown".
# configure_file rewrites OUTPUT only when its content changes, so an
# unchanged revision recompiles nothing.
#   cmake -DSOURCE_DIR=... -DTEMPLATE=... -DOUTPUT=... -DVERSION=... \
#         -DCOMPILER=... -DCUDA=... [-DREVISION=...] -P BuildInfo.cmake
set(GC_VERSION "${VERSION}")
set(GC_COMPILER "${COMPILER}")
set(GC_CUDA "${CUDA}")
set(GC_REVISION "${REVISION}")
if(GC_REVISION STREQUAL "")
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(
      COMMAND "${GIT_EXECUTABLE}" -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
              --match=no-tag-matches-this
      OUTPUT_VARIABLE GC_REVISION OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE result ERROR_QUIET)
    if(NOT result EQUAL 0)
      set(GC_REVISION "")
    endif()
  endif()
endif()
if(GC_REVISION STREQUAL "")
  set(GC_REVISION "unknown")
endif()
configure_file("${TEMPLATE}" "${OUTPUT}" @ONLY)
