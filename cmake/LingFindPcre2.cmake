# PCRE2 (8-bit) as the imported target ling::pcre2, found by header and library (no pkg-config needed, so the
# same code works with Debian's package and with headers/libs unpacked under a prefix on CMAKE_PREFIX_PATH).
if(NOT TARGET ling::pcre2)
  find_path(LING_PCRE2_INCLUDE_DIR pcre2.h)
  find_library(LING_PCRE2_LIBRARY NAMES pcre2-8 libpcre2-8.so.0)
  if(NOT LING_PCRE2_INCLUDE_DIR OR NOT LING_PCRE2_LIBRARY)
    message(FATAL_ERROR "PCRE2 (8-bit) not found: install libpcre2-dev (make deps does this as root)")
  endif()
  add_library(ling::pcre2 UNKNOWN IMPORTED)
  set_target_properties(ling::pcre2 PROPERTIES IMPORTED_LOCATION "${LING_PCRE2_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${LING_PCRE2_INCLUDE_DIR}"
                        INTERFACE_COMPILE_DEFINITIONS "PCRE2_CODE_UNIT_WIDTH=8")
endif()
