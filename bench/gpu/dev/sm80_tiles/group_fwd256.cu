#include "variants.cuh"
void add_fwd256(std::vector<Variant>& v) {
  FWD("128x64w8 (adopted)", 256, 0, 128, 64, 8);
  FWD("64x64w4", 256, 0, 64, 64, 4);
  FWD("64x64w4 (adopted)", 256, 1, 64, 64, 4);
  FWD("128x64w8", 256, 1, 128, 64, 8);
}
