/* version.c — version string and build description (filled by CMake). */
#include "moerun/base.h"
#include "moerun_build.h"

const char *mr_version(void) { return MOERUN_VERSION_STRING; }
const char *mr_build_info(void) { return MOERUN_BUILD_INFO; }
