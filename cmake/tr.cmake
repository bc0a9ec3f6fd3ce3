# Helpers shared by every CMakeLists.txt: one static library per relay/ module, and cmocka tests.
# Include paths are rooted at the project, so code says #include "relay/producer/ipc_frame.h".

# tr_module(NAME SOURCES a.c b.c DEPS other_module PkgConfig::X)
function(tr_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${M_SOURCES})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${M_DEPS})
endfunction()

# tr_test(NAME SOURCES t.c DEPS module... [TIMEOUT s] [LABELS l...])
# Builds a cmocka test executable and registers it with ctest. Tests find the recorded
# Perfetto vectors through TR_VECTORS_DIR and built programs through TR_BIN_DIR.
function(tr_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${T_DEPS} PkgConfig::CMOCKA)
  target_compile_definitions(${name} PRIVATE
    TR_VECTORS_DIR="${TR_VECTORS_DIR}" TR_BIN_DIR="${CMAKE_BINARY_DIR}/bin"
    TR_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
endfunction()

# tr_program(NAME [INTERNAL] SOURCES ... DEPS ...): an executable placed in build/bin, installed
# (and packaged, cmake/package.cmake) unless INTERNAL (tools for tests and benchmarks).
function(tr_program name)
  cmake_parse_arguments(P "INTERNAL" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${P_SOURCES})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PRIVATE ${P_DEPS})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  if(NOT P_INTERNAL)
    install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()
