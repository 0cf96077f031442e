#include <cstdio>
#include "kcache/tier.h"
int main() { std::printf("kcache %s\n", kcache::version_string()); return 0; }
