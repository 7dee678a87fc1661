# Checks that each GoogleTest pattern names at least one case of a test binary: a case renamed out
# of its quiver_test(... ALONE ...) list would otherwise run beside other tests without a word.
# Arguments, as -D definitions before -P:
#   BINARY    the test binary
#   PATTERNS  the patterns, separated by ':' (as in --gtest_filter; add_test would split at ';')
string(REPLACE ":" ";" patterns "${PATTERNS}")
if(NOT patterns)
  message(FATAL_ERROR "no patterns to check")
endif()
foreach(pattern IN LISTS patterns)
  execute_process(COMMAND "${BINARY}" --gtest_list_tests "--gtest_filter=${pattern}"
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${BINARY} --gtest_list_tests: exit status ${status}:\n${out}${err}")
  endif()
  # gtest lists a suite on a line of its own and each of its cases below it, indented two spaces.
  if(NOT out MATCHES "\n  [^ \n]")
    message(FATAL_ERROR "'${pattern}' names no test case of ${BINARY}")
  endif()
endforeach()
