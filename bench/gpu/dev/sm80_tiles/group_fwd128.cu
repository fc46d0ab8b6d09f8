#include "variants.cuh"
void add_fwd128(std::vector<Variant>& v) {
  FWD("128x64w4 (adopted)", 128, 0, 128, 64, 4);
  FWD("128x64w4 (adopted)", 128, 1, 128, 64, 4);
}
