# Runs a program and checks both its exit status and its output (PASS_REGULAR_EXPRESSION alone
# ignores the status). Arguments, as -D definitions before -P:
#   RUN     the command line, its words separated by '|' (a ';' would split the add_test argument)
#   EXIT    the exit status it must return
#   OUTPUT  a regular expression its stdout and stderr together must match
string(REPLACE "|" ";" command "${RUN}")
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
set(all "${out}${err}")
if(NOT status STREQUAL "${EXIT}")
  message(FATAL_ERROR "exit status ${status}, expected ${EXIT}; output:\n${all}")
endif()
if(NOT all MATCHES "${OUTPUT}")
  message(FATAL_ERROR "output does not match '${OUTPUT}':\n${all}")
endif()
message(STATUS "exit ${status}, output as expected: ${all}")
