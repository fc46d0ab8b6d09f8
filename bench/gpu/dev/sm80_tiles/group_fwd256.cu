#include "variants.cuh"
void add_fwd256(std::vector<Variant>& v) {
  FWD("64x64w4 (cur)", 256, 0, 64, 64, 4); FWD("128x64w8 (FA2)", 256, 0, 128, 64, 8);
  FWD("64x64w4 (cur)", 256, 1, 64, 64, 4); FWD("128x64w8 (FA2)", 256, 1, 128, 64, 8);
}
