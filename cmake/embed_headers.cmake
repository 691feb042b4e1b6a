# Writes OUT: a C file defining kiln_cdefs(), the public headers (HEADERS, in order) as one string.
string(REPLACE "|" ";" HEADERS "${HEADERS}")
set(text "")
foreach(h ${HEADERS})
  file(READ "${h}" body)
  string(APPEND text "${body}\n")
endforeach()
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n\"" text "${text}")
file(WRITE "${OUT}.tmp" "/* generated from the public headers by cmake/embed_headers.cmake */\n"
  "#include \"internal.h\"\n"
  "static const char cdefs[] =\n\"${text}\";\n"
  "KILN_API const char *kiln_cdefs(void) { return cdefs; }\n")
file(RENAME "${OUT}.tmp" "${OUT}")
