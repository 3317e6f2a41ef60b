# Runs a program with and without memsnap's CUPTI injection and compares (cmake -P).
#   -DPROGRAM=exe -DLIB=libmemsnap_cupti.so -DWORK=dir -DMODE=same|bad_config|probe
# same:       PROGRAM runs twice, plain and under CUDA_INJECTION64_PATH + NVTX_INJECTION64_PATH;
#             exit code and stdout must match, stderr may differ by at most one memsnap line.
# bad_config: PROGRAM is inject_probe; MEMSNAP_INTERVAL=abc must give exactly one line naming it.
# probe:      PROGRAM is inject_probe; initialising must return 1 and say at most one line.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(memsnap_env MEMSNAP_FOLDER=${WORK}/run MEMSNAP_RUN_NAME=ci)

# Lines memsnap wrote ("memsnap: ...", "memsnap[rank 0] warning: ...").
function(memsnap_lines text out)
  string(REPLACE ";" "," text "${text}")
  string(REGEX MATCHALL "(^|\n)memsnap[^\n]*" lines "${text}")
  list(LENGTH lines n)
  set(${out} ${n} PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "same")
  execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc0 OUTPUT_VARIABLE out0 ERROR_VARIABLE err0 TIMEOUT 120)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${memsnap_env} CUDA_INJECTION64_PATH=${LIB} NVTX_INJECTION64_PATH=${LIB}
                          ${PROGRAM}
                  RESULT_VARIABLE rc1 OUTPUT_VARIABLE out1 ERROR_VARIABLE err1 TIMEOUT 120)
  message(STATUS "without: rc=${rc0} out=[${out0}] err=[${err0}]")
  message(STATUS "with:    rc=${rc1} out=[${out1}] err=[${err1}]")
  if(NOT rc0 STREQUAL rc1)
    message(FATAL_ERROR "exit code differs: ${rc0} without memsnap, ${rc1} with it")
  endif()
  if(NOT out0 STREQUAL out1)
    message(FATAL_ERROR "stdout differs with memsnap")
  endif()
  string(REGEX REPLACE "memsnap[^\n]*\n?" "" err1_rest "${err1}")
  if(NOT err0 STREQUAL err1_rest)
    message(FATAL_ERROR "stderr differs beyond memsnap's lines")
  endif()
  memsnap_lines("${err1}" n)
  if(n GREATER 1)
    message(FATAL_ERROR "memsnap said ${n} lines; at most one is allowed")
  endif()
elseif(MODE STREQUAL "bad_config")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${memsnap_env} MEMSNAP_INTERVAL=abc ${PROGRAM} ${LIB}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  message(STATUS "rc=${rc} out=[${out}] err=[${err}]")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "InitializeInjection -> 1 1")
    message(FATAL_ERROR "the probe did not run through")
  endif()
  memsnap_lines("${err}" n)
  if(NOT n EQUAL 1 OR NOT err MATCHES "interval")
    message(FATAL_ERROR "expected exactly one memsnap line naming 'interval', got ${n}")
  endif()
  if(EXISTS ${WORK}/run)
    message(FATAL_ERROR "a refused run left a folder behind")
  endif()
elseif(MODE STREQUAL "probe")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${memsnap_env} ${PROGRAM} ${LIB}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  message(STATUS "rc=${rc} out=[${out}] err=[${err}]")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "InitializeInjection -> 1 1")
    message(FATAL_ERROR "the probe did not run through")
  endif()
  memsnap_lines("${err}" n)
  if(n GREATER 1)
    message(FATAL_ERROR "memsnap said ${n} lines; at most one is allowed")
  endif()
else()
  message(FATAL_ERROR "unknown MODE ${MODE}")
endif()
