# bin2c.cmake — cmake -DBIN2C=<bin2c> -DIN=<file> -DOUT=<header> -P bin2c.cmake
# Writes the C array `driver_kernels_fatbin` (unsigned long long, so 8-byte aligned) to OUT.
execute_process(
  COMMAND "${BIN2C}" --const --static --type longlong --name driver_kernels_fatbin "${IN}"
  OUTPUT_FILE "${OUT}.tmp"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE "${OUT}.tmp")
  message(FATAL_ERROR "bin2c failed (${rc}) on ${IN}")
endif()
file(RENAME "${OUT}.tmp" "${OUT}")
