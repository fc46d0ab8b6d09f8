#include "variants.cuh"
void add_bwd128(std::vector<Variant>& v) {
  BWD("64x128 2,4,2 (adopted)", 128, 0, 64, 128, 8, 2, 4, 2, 2);
  BWD("64x128 2,4,2 (adopted)", 128, 1, 64, 128, 8, 2, 4, 2, 2);
}
