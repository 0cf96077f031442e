// Prints the golden key; run by key_test under varied environments.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "golden_key.h"

int main() {
  // Disturb the heap so that addresses differ from the parent's.
  std::vector<void*> junk;
  for (int i = 0; i < (std::rand() % 7) + 1; ++i) junk.push_back(std::malloc(1000 + i * 37));
  auto k = golden_key();
  if (!k) return 3;
  std::printf("%s\n", k->key.hex().c_str());
  for (void* p : junk) std::free(p);
  return 0;
}
