#include "variants.cuh"
void add_bwd256(std::vector<Variant>& v) {
  BWD("64x64 4,2,2 (adopted)", 256, 0, 64, 64, 8, 4, 2, 2, 1);
  BWD("64x64 4,2,2 (adopted)", 256, 1, 64, 64, 8, 4, 2, 2, 1);
}
