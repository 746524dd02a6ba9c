/* Calls wc_set_log_level with any int, as a C caller may: C converts every int to an enum type,
 * while in C++ even loading an enum object that holds a value outside the enum's range is
 * undefined (and UBSan stops the test there, before the library is reached). */
#include <weightcache/weightcache.h>

void wc_test_set_log_level_raw(int level);

void wc_test_set_log_level_raw(int level) { wc_set_log_level((wc_log_level)level); }
